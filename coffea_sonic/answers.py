"""Answers checked against what was asked, and a call's outputs put back together in input order.

How it works, with examples: docs/internals/dispatch.md.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .core.tensors import ModelInfo, TensorInfo
from .errors import InferenceError

__all__ = ["assemble", "cast_output", "check_outputs", "check_version", "preallocate"]


def check_version(model: str, requested: str, answered: str, address: str) -> None:
    """Raise unless the version that answered is the one requested (either may be "")."""
    if requested and answered and answered != requested:
        raise InferenceError(
            f"model {model!r}: requested version {requested} but {address} answered "
            f"with version {answered}")


def check_outputs(model: str, info: ModelInfo, outputs: Mapping[str, Any], *, rows: int,
                  source: str, delivered: frozenset[str] = frozenset()
                  ) -> dict[str, np.ndarray]:
    """``outputs`` of a request of ``rows`` rows (padding included), checked against ``info``.

    ``delivered``: outputs already written into the call's rows (shape checked on arrival).
    Safe dtype casts are done; anything else raises ``InferenceError`` naming ``source``.
    """
    missing = [name for name in info.output_names if name not in outputs]
    if missing:
        raise InferenceError(
            f"model {model!r} at {source}: answer lacks outputs {missing} "
            f"(got {sorted(outputs)})")
    checked = {}
    for tensor in info.outputs:
        if tensor.name in delivered:
            checked[tensor.name] = outputs[tensor.name]
            continue
        array = np.asarray(outputs[tensor.name])
        if info.batching and (array.ndim == 0 or array.shape[0] != rows):
            raise InferenceError(
                f"model {model!r} at {source}: output {tensor.name!r} has shape "
                f"{list(array.shape)} for a request of {rows} rows; refusing misaligned outputs")
        expected = tuple(tensor.dims)
        got = array.shape[1:] if info.batching else array.shape
        if len(got) != len(expected) or any(d >= 0 and d != g for d, g in zip(expected, got)):
            raise InferenceError(
                f"model {model!r} at {source}: output {tensor.name!r} has per-row "
                f"shape {list(got)}, the model declares {list(expected)}")
        checked[tensor.name] = cast_output(model, tensor, array, source)
    return checked


def cast_output(model: str, tensor: TensorInfo, array: np.ndarray, source: str) -> np.ndarray:
    """``array`` in ``tensor``'s dtype where that cast is safe; else ``InferenceError``."""
    if array.dtype == tensor.dtype:
        return array
    if not np.can_cast(array.dtype, tensor.dtype, casting="safe"):
        raise InferenceError(
            f"model {model!r} output {tensor.name!r}: {source} gave "
            f"{array.dtype}, the model declares {tensor.dtype}")
    return array.astype(tensor.dtype)


def preallocate(info: ModelInfo, rows: int) -> dict[str, np.ndarray] | None:
    """A call's output arrays when every output's per-row shape is known, else None."""
    if not info.batching:
        return None
    if any(d < 0 for t in info.outputs for d in t.dims) or any(
            t.dtype == object for t in info.outputs):
        return None
    return {t.name: np.empty((rows, *t.dims), dtype=t.dtype) for t in info.outputs}


def assemble(model: str, info: ModelInfo, rows: int, pieces: Sequence[tuple[int, int]],
             results: Sequence[Mapping[str, np.ndarray] | None],
             out: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """A plain call's outputs in input order: ``out`` (every piece wrote its rows there) or the
    pieces' ``results`` concatenated once. ``pieces``: each piece's ``(start, stop)``."""
    lost = sum(result is None for result in results)
    if lost:  # never hand out a call with a piece missing
        raise InferenceError(f"model {model!r}: {lost} of {len(results)} requests of a {rows}-row "
                             "call have no answer")
    if out is not None:
        outputs = out
    else:
        outputs = {}
        for name in info.output_names:
            parts = [result[name][: stop - start]  # type: ignore[index]
                     for (start, stop), result in zip(pieces, results)]
            outputs[name] = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
    for name, array in outputs.items():
        if len(array) != rows:
            raise InferenceError(
                f"model {model!r}: assembled {len(array)} rows of output "
                f"{name!r} for {rows} input rows")
    return outputs
