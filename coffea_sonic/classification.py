"""Triton's classification extension: the server answers an output with its top K classes.

``TritonModel(url, classification=3)`` asks every output of the model for its 3 highest scores;
``classification={"probs": 3}`` asks one output. The server sorts the scores and answers, per
row, K strings ``"score:index:label"``, the labels from the output's ``label_filename`` in the
model's config (one label per line, the class index is the line). The answer of such an output
is a BYTES array ``[rows, K]``; :func:`parse_classes` splits it into scores, indices and labels.

A K the model cannot give is refused before anything is sent, naming the model, output,
expected and actual: K must be a whole number from 1 to the output's number of classes, the
output numeric, and its config must name a label file (Triton would answer ``"score:index"``
without labels: ask for the scores instead and rank them with numpy).

Shared memory: Triton writes a classified output only into its answer message (the server's
allocator takes a shared-memory region for an output's raw tensor, never for the ranked
strings), so the shared-memory transports place the other outputs in their regions and receive
a classified one over the wire.

Classification is the server's work: the in-process engines (``fallback``, ``shadow``) return
scores, not ranked labels, so a classified model is served only (they are refused together).

>>> from coffea_sonic.core.tensors import ModelInfo, TensorInfo
>>> info = ModelInfo("tagger", ("1",), "python", 8, (TensorInfo("x", "FP32", (6,)),),
...                  (TensorInfo("probs", "FP32", (4,), labelled=True),))
>>> classified(info, 2).outputs[0].describe()
'probs BYTES[2] (top 2 classes)'
>>> scores, indices, labels = parse_classes(np.array([[b"0.75:2:b", b"0.2:0:light"]]))
>>> scores.tolist(), indices.tolist(), labels.tolist()
([[0.75, 0.2]], [[2, 0]], [['b', 'light']])
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
