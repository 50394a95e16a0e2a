"""Triton's classification extension: the server answers an output with its top K classes.

What is asked, refused and answered, with examples: docs/internals/shadow.md.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Union

import numpy as np

from .core.tensors import ModelInfo, TensorInfo
from .errors import ConfigurationError, InferenceError

__all__ = ["ClassificationChoice", "check_classification", "classified", "parse_classes"]

#: K for every output, or ``{output name: K}``; None: scores as the model computes them
ClassificationChoice = Union[int, Mapping[str, int], None]


def check_classification(choice: ClassificationChoice,
                         model: str = "?") -> dict[str, int] | int | None:
    """``choice`` checked for type and range (the output names are checked against the served
    model in :func:`classified`).

    >>> check_classification(0, "tagger")
    Traceback (most recent call last):
    ...
    coffea_sonic.errors.ConfigurationError: model 'tagger': classification asks the server for \
each row's top K classes, so K must be a whole number >= 1 (expected 1 up to the output's number \
of classes), got 0; leave classification out (None) for the scores themselves
    """
    if choice is None:
        return None
    if isinstance(choice, Mapping):
        if not choice:
            raise ConfigurationError(
                f"model {model!r}: classification={{}} names no output; name outputs and their "
                "K, e.g. {'probs': 3}, or leave classification out (None)")
        return {str(name): _count(model, name, k) for name, k in choice.items()}
    return _count(model, None, choice)


def _count(model: str, name: str | None, k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        where = f" output {name!r}" if name is not None else ""
        raise ConfigurationError(
            f"model {model!r}{where}: classification asks the server for each row's top K "
            f"classes, so K must be a whole number >= 1 (expected 1 up to the output's number "
            f"of classes), got {k!r}; leave classification out (None) for the scores themselves")
    return int(k)


def classified(info: ModelInfo, choice: dict[str, int] | int | None) -> ModelInfo:
    """``info`` with the classified outputs as the server answers them: BYTES ``[K]`` per row.

    Raises :class:`~coffea_sonic.errors.ConfigurationError` naming the model, output, expected
    and actual when an output is unknown, not numeric, has fewer classes than K or no label
    file."""
    if not choice:
        return info
    counts = choice if isinstance(choice, dict) else {t.name: choice for t in info.outputs}
    known = {t.name: t for t in info.outputs}
    unknown = sorted(set(counts) - set(known))
    if unknown:
        raise ConfigurationError(
            f"model {info.name!r}: classification asks for outputs {unknown}, which it does not "
            f"have; its outputs: {sorted(known)}")
    outputs = tuple(_classified_output(info.name, t, counts[t.name]) if t.name in counts else t
                    for t in info.outputs)
    return dataclasses.replace(info, outputs=outputs)


def _classified_output(model: str, tensor: TensorInfo, k: int) -> TensorInfo:
    if tensor.dtype == object or tensor.dtype.kind not in "biuf":
        raise ConfigurationError(
            f"model {model!r} output {tensor.name!r}: classification ranks numeric scores "
            f"(expected a numeric output), this output is {tensor.datatype}")
    if not tensor.labelled:
        raise ConfigurationError(
            f"model {model!r} output {tensor.name!r}: classification={k} returns labels from "
            "the output's label_filename, and the served config names none (expected an output "
            "with label_filename, actual: no label file); add label_filename to that output in "
            "config.pbtxt, classify only labelled outputs ({output: K}), or ask for the scores "
            "and rank them with numpy")
    classes = int(np.prod(tensor.dims)) if all(d > 0 for d in tensor.dims) else -1
    if classes != -1 and k > classes:
        raise ConfigurationError(
            f"model {model!r} output {tensor.name!r}: classification={k} asks for more classes "
            f"than the output has ({tensor.describe()}: {classes}); use at most {classes}")
    return TensorInfo(tensor.name, "BYTES", (k,), classification=k, labelled=True)


def parse_classes(answer: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(scores float64, class indices int64, labels str)`` of a classified output, each shaped
    like ``answer``; a label is ``""`` where the model has no label file."""
    flat = np.asarray(answer, dtype=object).reshape(-1)
    scores = np.empty(flat.shape, np.float64)
    indices = np.empty(flat.shape, np.int64)
    labels = np.empty(flat.shape, object)
    for position, entry in enumerate(flat):
        text = entry.decode() if isinstance(entry, bytes) else str(entry)
        parts = text.split(":", 2)
        try:
            scores[position], indices[position] = float(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            raise InferenceError(
                f"classification entry {text!r} is not 'score:index[:label]'") from None
        labels[position] = parts[2] if len(parts) == 3 else ""
    shape = np.shape(answer)
    return scores.reshape(shape), indices.reshape(shape), labels.reshape(shape)
