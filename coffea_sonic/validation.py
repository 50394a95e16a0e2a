"""Check inputs against a model's declaration and plan how a call is split into requests.

The rules (names, dims, safe dtype casts, the NaN/inf policy), with examples:
docs/internals/dispatch.md.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Mapping

import numpy as np

from .errors import ConfigurationError, InputValidationError
from .core.tensors import ModelInfo, TensorInfo

__all__ = ["GRPC_MESSAGE_LIMIT", "NONFINITE_POLICIES", "NonFinitePolicy", "check_finite_rows",
           "empty_outputs", "plan_pieces", "validate_inputs"]

logger = logging.getLogger(__name__)

#: gRPC's message size limit; requests are kept this far below it for protobuf framing.
GRPC_MESSAGE_LIMIT = 2**31 - 1
_FRAMING_HEADROOM = 1 << 20

NonFinitePolicy = Literal["pass", "warn", "raise"]
NONFINITE_POLICIES: tuple[str, ...] = ("pass", "warn", "raise")
#: (model, tensor) pairs already warned about in this process (each is warned about once)
_warned_nonfinite: set[tuple[str, str]] = set()


def _shape_text(info: ModelInfo, tensor: TensorInfo) -> str:
    dims = ["N"] * info.batching + [str(d) if d >= 0 else "*" for d in tensor.dims]
    return "[" + ", ".join(dims) + "]"


def _check_dtype(info: ModelInfo, tensor: TensorInfo, array: np.ndarray) -> np.ndarray:
    expected = tensor.dtype
    if expected == object:  # BYTES: str/bytes/object arrays are all serialized the same way
        if array.dtype == object or array.dtype.kind in "SU":
            return array
    elif array.dtype == expected:
        return array
    elif np.can_cast(array.dtype, expected, casting="safe"):
        return array.astype(expected)
    raise InputValidationError(
        f"model {info.name!r} input {tensor.name!r}: expected dtype {expected} "
        f"({tensor.datatype}), got {array.dtype}; {array.dtype} -> {expected} is not a safe cast. "
        f"Convert explicitly, e.g. .astype(np.{expected}), if the precision loss is acceptable")


def validate_inputs(info: ModelInfo, inputs: Mapping[str, Any],
                    nonfinite: NonFinitePolicy = "pass") -> tuple[dict[str, np.ndarray], int]:
    """Checked, C-contiguous, correctly typed arrays in declaration order, and the row count."""
    if not isinstance(inputs, Mapping):
        raise InputValidationError(
            f"model {info.name!r} takes a dict {{input name: array}} with inputs "
            f"{list(info.input_names)}, got {type(inputs).__name__}")
    if nonfinite not in NONFINITE_POLICIES:
        raise ConfigurationError(
            f"nonfinite must be 'pass', 'warn' or 'raise', not {nonfinite!r}")
    _check_names(info, inputs)
    arrays: dict[str, np.ndarray] = {}
    rows: int | None = None
    rows_from = ""
    for tensor in info.inputs:
        array = _checked_array(info, tensor, inputs[tensor.name], nonfinite)
        if rows is None:
            rows, rows_from = int(array.shape[0]), tensor.name
        elif array.shape[0] != rows:
            raise InputValidationError(
                f"model {info.name!r}: input {tensor.name!r} has {array.shape[0]} rows but "
                f"{rows_from!r} has {rows}; all inputs need the same number of rows")
        arrays[tensor.name] = np.ascontiguousarray(array)
    return arrays, int(rows or 0)


def _check_names(info: ModelInfo, inputs: Mapping[str, Any]) -> None:
    """Raise unless ``inputs`` names exactly the model's inputs."""
    given, declared = set(inputs), set(info.input_names)
    missing, extra = sorted(declared - given), sorted(given - declared)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            parts.append(f"unexpected {extra}")
        raise InputValidationError(
            f"model {info.name!r} inputs: {' and '.join(parts)}; the model declares "
            + ", ".join(f"{t.name} {_shape_text(info, t)} {t.datatype}" for t in info.inputs))


def _checked_array(info: ModelInfo, tensor: TensorInfo, value: Any,
                   nonfinite: NonFinitePolicy) -> np.ndarray:
    """``value`` as an array of ``tensor``'s rank, per-row shape and dtype (rows not checked)."""
    try:
        array = np.asarray(value)
    except Exception as error:  # e.g. a jagged awkward array
        raise InputValidationError(
            f"model {info.name!r} input {tensor.name!r}: cannot be made a regular numpy array "
            f"({type(error).__name__}: {error}); pad/flatten jagged columns first "
            "(coffea_sonic.columns helpers)") from None
    expected_rank = len(tensor.dims) + (1 if info.batching else 0)
    if array.ndim != expected_rank:
        raise InputValidationError(
            f"model {info.name!r} input {tensor.name!r}: expected rank {expected_rank} "
            f"{_shape_text(info, tensor)}, got rank {array.ndim} shape {list(array.shape)}")
    row_dims = array.shape[1:] if info.batching else array.shape
    for axis, (want, have) in enumerate(zip(tensor.dims, row_dims)):
        if want >= 0 and want != have:
            raise InputValidationError(
                f"model {info.name!r} input {tensor.name!r}: expected shape "
                f"{_shape_text(info, tensor)}, got {list(array.shape)} (dim "
                f"{axis + (1 if info.batching else 0)} is {have}, must be {want})")
    array = _check_dtype(info, tensor, array)
    if nonfinite != "pass" and array.dtype.kind == "f":
        _check_finite(info.name, tensor.name, array, nonfinite)
    if array.ndim == 0:
        raise InputValidationError(
            f"model {info.name!r} input {tensor.name!r} is a scalar; rows are needed")
    return array


def _check_finite(model: str, tensor: str, array: np.ndarray, nonfinite: str) -> None:
    """Raise (``"raise"``) or warn once (``"warn"``) where ``array`` holds NaN/inf."""
    if nonfinite == "warn" and (model, tensor) in _warned_nonfinite:
        return
    with np.errstate(all="ignore"):  # a sum is one fast pass; only a non-finite one is counted
        if np.isfinite(array.sum()):
            return
    bad = int(np.count_nonzero(~np.isfinite(array)))
    if not bad:
        return
    if nonfinite == "raise":
        raise InputValidationError(
            f"model {model!r} input {tensor!r}: {bad} NaN/inf values of {array.size} and "
            "nonfinite='raise'; clean them (e.g. np.nan_to_num) or use nonfinite='warn'")
    _warned_nonfinite.add((model, tensor))
    logger.warning("coffea-sonic: model %r input %r holds %d NaN/inf values of %d; they are sent "
                   "as they are (the model decides, as it would in-process). Said once per model "
                   "and tensor; nonfinite='raise' rejects them, 'pass' stops looking",
                   model, tensor, bad, array.size)


def check_finite_rows(model: str, arrays: Mapping[str, np.ndarray], start: int, stop: int,
                      nonfinite: NonFinitePolicy) -> None:
    """Apply ``nonfinite`` to rows ``start:stop`` of a call's validated ``arrays``; where they
    hold NaN/inf, the whole call's values are counted for the message (as
    :func:`validate_inputs` would have said).

    >>> x = np.array([[1.0, 2.0], [np.nan, 3.0], [np.inf, 4.0]], np.float32)
    >>> check_finite_rows("m", {"x": x}, 0, 1, "raise")  # the first row is clean
    >>> check_finite_rows("m", {"x": x}, 1, 3, "raise")
    Traceback (most recent call last):
    ...
    coffea_sonic.errors.InputValidationError: model 'm' input 'x': 2 NaN/inf values of 6 and nonfinite='raise'; clean them (e.g. np.nan_to_num) or use nonfinite='warn'
    """
    if nonfinite == "pass":
        return
    for name, array in arrays.items():
        if array.dtype.kind != "f" or (nonfinite == "warn" and (model, name) in _warned_nonfinite):
            continue
        with np.errstate(all="ignore"):
            if np.isfinite(array[start:stop].sum()):
                continue
        _check_finite(model, name, array, nonfinite)


def _row_bytes(arrays: Mapping[str, np.ndarray], rows: int) -> int:
    total = 0
    for array in arrays.values():
        if array.dtype == object or array.dtype.kind in "SU":
            # 4-byte length prefix per element plus the payload
            total += sum(len(x if isinstance(x, bytes) else str(x).encode()) + 4
                         for x in array.reshape(-1))
        else:
            total += array.nbytes
    return max(1, -(-total // max(rows, 1)))


def plan_pieces(info: ModelInfo, arrays: Mapping[str, np.ndarray], rows: int,
                max_request_bytes: int) -> list[tuple[int, int, int]]:
    """``[(start, stop, zero_pad_rows), ...]`` covering ``rows`` in order, one per request (how
    pieces are sized and padded: docs/internals/dispatch.md)."""
    if rows == 0:
        return []
    row_bytes = _row_bytes(arrays, rows)
    if row_bytes > GRPC_MESSAGE_LIMIT - _FRAMING_HEADROOM:
        raise InputValidationError(
            f"model {info.name!r}: one row of inputs is {row_bytes} bytes, over gRPC's 2 GiB "
            "message limit; such rows cannot be sent in one request")
    by_bytes = max(1, max_request_bytes // row_bytes)
    if info.batching:
        per_piece, fixed = min(info.max_batch_size, by_bytes), False
    else:
        first_dims = {t.dims[0] if t.dims else None for t in info.inputs}
        if None in first_dims or len(first_dims) != 1:
            raise ConfigurationError(
                f"model {info.name!r} has no batching (max_batch_size 0) and its inputs do not "
                f"share a leading row dimension ({[t.describe() for t in info.inputs]}); "
                "it cannot be split into rows")
        leading = first_dims.pop()
        if leading is not None and leading > 0:
            per_piece, fixed = leading, True
            if leading * row_bytes > GRPC_MESSAGE_LIMIT - _FRAMING_HEADROOM:
                raise InputValidationError(
                    f"model {info.name!r} demands {leading} rows per request, over gRPC's 2 GiB "
                    "message limit")
        else:
            per_piece, fixed = by_bytes, False
    if not fixed:
        # equal pieces: 2048 rows under a cap of 1800 go as 1024 + 1024, not 1800 + 248, so
        # no request is a small, mostly fixed-cost one and the pieces finish together
        per_piece = -(-rows // -(-rows // per_piece))
    pieces = []
    for start in range(0, rows, per_piece):
        stop = min(start + per_piece, rows)
        pad = per_piece - (stop - start) if fixed else 0
        pieces.append((start, stop, pad))
    return pieces


def piece_arrays(arrays: Mapping[str, np.ndarray], start: int, stop: int,
                 pad: int) -> dict[str, np.ndarray]:
    """The rows ``start:stop`` of every input, followed by ``pad`` rows of zeros."""
    if not pad:
        return {name: array[start:stop] for name, array in arrays.items()}
    padded = {}
    for name, array in arrays.items():
        block = np.zeros((stop - start + pad,) + array.shape[1:], dtype=array.dtype)
        if array.dtype == object:
            block[...] = b""
        block[: stop - start] = array[start:stop]
        padded[name] = block
    return padded


def empty_outputs(info: ModelInfo) -> dict[str, np.ndarray]:
    """Zero-row outputs with the declared dtypes and dims (variable dims become 0).

    >>> from coffea_sonic.core.tensors import ModelInfo, TensorInfo
    >>> info = ModelInfo("m", ("1",), "python", 4, (TensorInfo("x", "FP32", (3,)),),
    ...                  (TensorInfo("y", "INT64", (2,)),))
    >>> empty_outputs(info)["y"].shape, empty_outputs(info)["y"].dtype
    ((0, 2), dtype('int64'))
    """
    outputs = {}
    for tensor in info.outputs:
        dims = tuple(max(d, 0) for d in tensor.dims)
        shape = (0,) + dims if info.batching else (0,) + dims[1:]
        outputs[tensor.name] = np.empty(shape, dtype=tensor.dtype)
    return outputs
