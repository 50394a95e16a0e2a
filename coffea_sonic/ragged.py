"""Ragged batching: many events' unpadded rows in one request, with the rows of each event.

:class:`RaggedCall` plans groups of whole events and cuts the answers back per event. The wire
convention, with examples: docs/internals/ragged.md.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .answers import cast_output
from .core.tensors import ModelInfo, TensorInfo
from .errors import InferenceError, InputValidationError
from .validation import GRPC_MESSAGE_LIMIT, NonFinitePolicy, validate_inputs

__all__ = ["COUNTS_SUFFIX", "RaggedCall", "RaggedSignature", "check_plain_call", "signature"]

logger = logging.getLogger(__name__)

#: The counts input of ragged input ``x`` is named ``x + COUNTS_SUFFIX``.
COUNTS_SUFFIX = "__counts"
#: What one request may carry at most: gRPC's message limit less 1 MiB of framing.
HARD_REQUEST_LIMIT = GRPC_MESSAGE_LIMIT - (1 << 20)


@dataclass(frozen=True)
class RaggedSignature:
    """A ragged model's declaration, as the client uses it.

    ``inputs``: the ragged inputs with their per-row dims ``D``; ``counts``: the counts input;
    ``object_outputs`` (per-row dims ``E``) and ``event_outputs`` (per-event dims).
    """

    model: str
    inputs: tuple[TensorInfo, ...]
    #: the counts input; None: a model in Triton's own ragged format (batch inputs built by the
    #: server), sent one request per event (:attr:`per_event`)
    counts: str | None
    object_outputs: tuple[TensorInfo, ...]
    event_outputs: tuple[TensorInfo, ...]

    @property
    def per_event(self) -> bool:
        """Whether each event goes in its own request (no counts input: SonicTriton's way)."""
        return self.counts is None

    @property
    def object_output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.object_outputs)


def _declaration_help() -> str:
    return (f"a ragged model declares max_batch_size >= 1, inputs 'x' (dims [-1, ...], "
            f"allow_ragged_batch: true) and 'x{COUNTS_SUFFIX}' (TYPE_INT64, dims [-1], "
            "allow_ragged_batch: true), and its per-object outputs in a batch_output of kind "
            "BATCH_SCATTER_WITH_INPUT_SHAPE (coffea_sonic.ragged; "
            "coffea_sonic.server.repository.ragged_model_config writes one)")


def signature(info: ModelInfo) -> RaggedSignature:
    """The ragged declaration of ``info``, or InputValidationError saying what is missing.

    >>> from coffea_sonic.core.tensors import ModelInfo, TensorInfo
    >>> plain = ModelInfo("jet_tagger", ("1",), "python", 8, (TensorInfo("features", "FP32", (6,)),),
    ...                   (TensorInfo("probs", "FP32", (3,)),))
    >>> signature(plain)
    Traceback (most recent call last):
    ...
    coffea_sonic.errors.InputValidationError: model 'jet_tagger' declares no ragged input ...
    """
    name = info.name
    if not info.batching:
        raise InputValidationError(
            f"model {name!r} cannot take ragged calls: expected max_batch_size >= 1, it declares "
            f"{info.max_batch_size} (no batching); {_declaration_help()}")
    declared = {t.name: t for t in info.inputs}
    ragged = [declared[n] for n in info.ragged_inputs if n in declared]
    data = [t for t in ragged if not t.name.endswith(COUNTS_SUFFIX)]
    if not data:
        raise InputValidationError(
            f"model {name!r} declares no ragged input (inputs "
            f"{[t.describe() for t in info.inputs]}, none with allow_ragged_batch: true besides "
            f"counts); expected {_declaration_help()}. Send padded rows without counts/ragged "
            "instead")
    counts = [t for t in info.inputs
              if t.name.endswith(COUNTS_SUFFIX) and t.name[: -len(COUNTS_SUFFIX)] in
              {d.name for d in data}]
    if len(counts) > 1:
        expected = " or ".join(repr(t.name + COUNTS_SUFFIX) for t in data)
        got = [t.name for t in counts]
        raise InputValidationError(
            f"model {name!r}: expected exactly one counts input {expected} (TYPE_INT64, dims [-1]) "
            f"for its ragged inputs {[t.name for t in data]}, it declares {got}; "
            f"{_declaration_help()}")
    count = counts[0] if counts else None
    if count is not None and (count.datatype != "INT64" or tuple(count.dims) != (-1,)):
        raise InputValidationError(
            f"model {name!r} input {count.name!r}: expected TYPE_INT64 dims [-1] (rows per "
            f"event), the model declares {count.datatype}{list(count.dims)}")
    _check_ragged_inputs(info, data, count)
    object_outputs, event_outputs = _split_outputs(info)
    return RaggedSignature(
        model=name,
        inputs=tuple(TensorInfo(t.name, t.datatype, tuple(t.dims[1:])) for t in data),
        counts=count.name if count is not None else None, object_outputs=tuple(object_outputs),
        event_outputs=tuple(event_outputs))


#: the last few models' ragged declarations, by identity: a model's info is one object for the
#: life of its TritonModel, and reading the declaration costs more than a small call's checks
_PREPARED: dict[int, tuple[ModelInfo, RaggedSignature, ModelInfo]] = {}


def _prepared(info: ModelInfo) -> tuple[RaggedSignature, ModelInfo]:
    """``info``'s ragged signature and the info its rows are validated against (rows of the
    ragged inputs, no outputs), computed once per info object."""
    entry = _PREPARED.get(id(info))
    if entry is not None and entry[0] is info:
        return entry[1], entry[2]
    sig = signature(info)
    flat = ModelInfo(info.name, info.versions, info.platform, info.max_batch_size, sig.inputs, ())
    if len(_PREPARED) >= 64:
        _PREPARED.clear()
    _PREPARED[id(info)] = (info, sig, flat)  # holding info keeps its id from being reused
    return sig, flat


def _check_ragged_inputs(info: ModelInfo, data: list[TensorInfo], count: TensorInfo) -> None:
    """Raise unless the model's inputs are its ragged ``data`` (numeric, dims [-1, ...]) and
    their ``count``."""
    name = info.name
    others = [t.name for t in info.inputs if t not in data and t is not count]
    if others:
        raise InputValidationError(
            f"model {name!r}: a ragged call sends only ragged inputs and their counts, but the "
            f"model also declares {others} (not allow_ragged_batch); declare them ragged "
            "(per-object rows) or call the model without counts/ragged")
    for tensor in data:
        if not tensor.dims or tensor.dims[0] != -1:
            raise InputValidationError(
                f"model {name!r} ragged input {tensor.name!r}: expected dims [-1, ...] (a "
                f"variable number of rows), the model declares {list(tensor.dims)}")
        if tensor.dtype == object:
            raise InputValidationError(
                f"model {name!r} ragged input {tensor.name!r} is {tensor.datatype}: ragged "
                "inputs must be numeric")


def _split_outputs(info: ModelInfo) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """The per-object outputs (their per-row dims) and the per-event outputs of ``info``."""
    object_outputs, event_outputs = [], []
    for tensor in info.outputs:
        if tensor.name in info.ragged_outputs:
            if not tensor.dims or tensor.dims[0] != -1:
                raise InputValidationError(
                    f"model {info.name!r} per-object output {tensor.name!r}: expected dims "
                    f"[-1, ...] (one row per object), the model declares {list(tensor.dims)}")
            object_outputs.append(TensorInfo(tensor.name, tensor.datatype, tuple(tensor.dims[1:])))
        else:
            event_outputs.append(tensor)
    return object_outputs, event_outputs


def check_plain_call(info: ModelInfo, inputs: Mapping[str, Any]) -> None:
    """Refuse, with the fix, a call without counts to a model that needs them.

    A one-event request (no counts input) is still allowed when the caller gives the counts input
    by hand or the model does not declare one.
    """
    if not info.ragged_inputs or not isinstance(inputs, Mapping):
        return
    needed = [t.name for t in info.inputs
              if t.name.endswith(COUNTS_SUFFIX) and t.name in info.ragged_inputs]
    if needed and not any(name in inputs for name in needed):
        data = [n for n in info.ragged_inputs if not n.endswith(COUNTS_SUFFIX)]
        raise InputValidationError(
            f"model {info.name!r} takes ragged inputs {data} with per-event counts {needed}: "
            "call model(inputs, counts=rows_per_event) (self.infer(..., ragged=True) in a "
            "processor); see coffea_sonic.ragged")


def _counts_array(sig: RaggedSignature, counts: Any, rows: int) -> np.ndarray:
    where = f"model {sig.model!r} input {sig.counts!r}"
    try:
        array = np.asarray(counts)
    except Exception as error:  # noqa: BLE001 - e.g. an awkward array of lists
        raise InputValidationError(f"{where}: counts must be a 1-d integer array of rows per "
                                   f"event, got {type(counts).__name__} ({error})") from None
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise InputValidationError(
            f"{where}: expected a 1-d integer array of rows per event, got shape "
            f"{list(array.shape)} dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    if len(array) and int(array.min()) < 0:
        bad = int(np.argmax(array < 0))
        raise InputValidationError(
            f"{where}: expected counts >= 0, event {bad} has {int(array[bad])}")
    total = int(array.sum())
    if total != rows:
        names = ", ".join(repr(t.name) for t in sig.inputs)
        raise InputValidationError(
            f"{where}: the counts of {len(array)} events sum to {total} rows but {names} "
            f"{'has' if len(sig.inputs) == 1 else 'have'} {rows}; expected counts that sum to "
            "the rows given (one entry per event, in row order)")
    return np.ascontiguousarray(array)


@dataclass(eq=False)
class RaggedCall:
    """One ragged call: validated rows, counts per event, and how they are split and joined."""

    signature: RaggedSignature
    arrays: dict[str, np.ndarray]
    counts: np.ndarray
    #: row offsets of the events: event ``i`` is rows ``offsets[i]:offsets[i + 1]``
    offsets: np.ndarray

    @classmethod
    def build(cls, info: ModelInfo, inputs: Mapping[str, Any], counts: Any,
              nonfinite: NonFinitePolicy = "pass") -> "RaggedCall":
        """Check ``inputs`` (rows of the ragged inputs) and ``counts`` against ``info``."""
        sig, flat = _prepared(info)
        if isinstance(inputs, Mapping) and sig.counts is not None and sig.counts in inputs:
            raise InputValidationError(
                f"model {sig.model!r}: input {sig.counts!r} is filled by the client from "
                "counts=; leave it out of the inputs")
        arrays, rows = validate_inputs(flat, inputs, nonfinite)
        array = _counts_array(sig, counts, rows)
        offsets = np.zeros(len(array) + 1, dtype=np.int64)
        np.cumsum(array, out=offsets[1:])
        return cls(sig, arrays, array, offsets)

    @property
    def events(self) -> int:
        return len(self.counts)

    @property
    def rows(self) -> int:
        return int(self.offsets[-1])

    def _row_bytes(self) -> int:
        return sum(a.dtype.itemsize * math.prod(a.shape[1:]) for a in self.arrays.values())

    def plan(self, max_request_bytes: int) -> list[tuple[int, int, int]]:
        """``[(first_event, stop_event, 0), ...]``: groups of whole events, at most
        ``max_request_bytes`` each (rows plus 8 bytes of count per event) and about equal; an
        event over the cap goes alone, one over gRPC's limit raises InputValidationError."""
        if not self.events:
            return []
        if self.signature.per_event:  # Triton concatenates them: one request per event
            return [(event, event + 1, 0) for event in range(self.events)]
        row_bytes = self._row_bytes()
        if self.rows * row_bytes + 8 * self.events <= max_request_bytes:
            return [(0, self.events, 0)]  # the whole call fits one request
        event_bytes = self.counts * row_bytes + 8
        ends = np.cumsum(event_bytes)
        greedy = self._groups(event_bytes, ends, max_request_bytes, None)
        over = np.flatnonzero(event_bytes > max_request_bytes)
        if len(over):
            logger.info("coffea-sonic: %s: %d event(s) over the request cap of %d bytes (the "
                        "first: event %d, %d bytes) are sent alone", self.signature.model,
                        len(over), max_request_bytes, int(over[0]), int(event_bytes[over[0]]))
        if len(greedy) < 2:
            return greedy
        # the same number of groups, cut as close as possible to equal shares of the bytes
        balanced = self._groups(event_bytes, ends, max_request_bytes,
                                float(ends[-1]) / len(greedy))
        return balanced if len(balanced) <= len(greedy) else greedy

    def _groups(self, event_bytes: np.ndarray, ends: np.ndarray, cap: int,
                share: float | None) -> list[tuple[int, int, int]]:
        groups: list[tuple[int, int, int]] = []
        start, base = 0, 0
        while start < self.events:
            most = int(np.searchsorted(ends, base + cap, side="right"))
            if most <= start:  # this event alone is over the cap
                size = int(event_bytes[start])
                if size > HARD_REQUEST_LIMIT:
                    raise InputValidationError(
                        f"model {self.signature.model!r}: event {start} has "
                        f"{int(self.counts[start])} rows, {size} bytes; expected at most "
                        f"{HARD_REQUEST_LIMIT} bytes per event (gRPC's 2 GiB message limit), "
                        "and an event is never split across requests. Split or thin the event")
                stop = start + 1
            elif share is None:
                stop = most
            else:
                boundary = (len(groups) + 1) * share
                below = int(np.searchsorted(ends, boundary, side="right"))
                stop = min({min(max(c, start + 1), most) for c in (below, below + 1)},
                           key=lambda c: (abs(float(ends[c - 1]) - boundary), c))
            groups.append((start, stop, 0))
            base = int(ends[stop - 1])
            start = stop
        return groups

    def tensors(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """The request of events ``start:stop``: ``x [1, R, *D]`` and ``x__counts [1, G]``."""
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        tensors = {name: array[first:last][np.newaxis] for name, array in self.arrays.items()}
        if self.signature.counts is not None:
            tensors[self.signature.counts] = self.counts[start:stop][np.newaxis]
        return tensors

    def request_outputs(self, start: int, stop: int) -> tuple[TensorInfo, ...]:
        """The answer's expected shapes: ``[1, R, *E]`` per object and ``[G, *E]`` per event
        (an empty or variable axis stays ``-1``: such outputs come back in the message)."""
        rows = int(self.offsets[stop] - self.offsets[start])
        sig = self.signature
        return (tuple(TensorInfo(t.name, t.datatype, (1, rows if rows else -1, *t.dims))
                      for t in sig.object_outputs)
                + tuple(TensorInfo(t.name, t.datatype, (stop - start, *t.dims))
                        for t in sig.event_outputs))

    def check(self, start: int, stop: int, outputs: Mapping[str, Any],
              source: str) -> dict[str, np.ndarray]:
        """The answer for events ``start:stop``, checked: per-object ``[R, *E]``, per-event
        ``[G, *E]``; InferenceError for anything else (never misaligned outputs)."""
        sig = self.signature
        rows = int(self.offsets[stop] - self.offsets[start])
        events = stop - start
        names = [t.name for t in sig.object_outputs + sig.event_outputs]
        missing = [name for name in names if name not in outputs]
        if missing:
            raise InferenceError(
                f"model {sig.model!r} at {source}: answer lacks outputs {missing} "
                f"(got {sorted(outputs)})")
        checked: dict[str, np.ndarray] = {}
        for tensor, per_object in ([(t, True) for t in sig.object_outputs]
                                   + [(t, False) for t in sig.event_outputs]):
            array = np.asarray(outputs[tensor.name])
            lead = (1, rows) if per_object else (events,)
            expected = [*lead, *(d if d >= 0 else "*" for d in tensor.dims)]
            shape = array.shape
            if (len(shape) != len(expected) or shape[: len(lead)] != lead
                    or any(d >= 0 and d != g for d, g in zip(tensor.dims, shape[len(lead):]))):
                what = f"{rows} rows" if per_object else f"{events} events"
                raise InferenceError(
                    f"model {sig.model!r} at {source}: {'per-object' if per_object else 'per-event'}"
                    f" output {tensor.name!r} has shape {list(shape)} for a group of {events} "
                    f"events with {rows} rows; expected {expected} (one row per "
                    f"{'object' if per_object else 'event'}: {what}); refusing misaligned outputs")
            array = cast_output(sig.model, tensor, array, source)
            checked[tensor.name] = array[0] if per_object else array
        return checked

    def assemble(self, groups: Sequence[tuple[int, int]],
                 results: Sequence[Mapping[str, np.ndarray] | None]) -> dict[str, np.ndarray]:
        """Every group's checked outputs joined in event order: per-object outputs of
        :attr:`rows` rows, per-event outputs of :attr:`events` rows."""
        if len(groups) != len(results) or any(result is None for result in results):
            raise InferenceError(f"model {self.signature.model!r}: a group of events has no "
                                 "answer; refusing partial outputs")
        outputs: dict[str, np.ndarray] = {}
        sig = self.signature
        for tensor, total in ([(t, self.rows) for t in sig.object_outputs]
                              + [(t, self.events) for t in sig.event_outputs]):
            parts = [result[tensor.name] for result in results]  # type: ignore[index]
            array = np.concatenate(parts)  # a new array, one part or many
            if len(array) != total:
                raise InferenceError(
                    f"model {sig.model!r}: assembled {len(array)} rows of output "
                    f"{tensor.name!r}, expected {total}")
            outputs[tensor.name] = array
        return outputs

    def empty_outputs(self) -> dict[str, np.ndarray]:
        """Zero-event outputs with the declared dtypes (variable dims become 0)."""
        sig = self.signature
        return {t.name: np.empty((0, *(max(d, 0) for d in t.dims)), dtype=t.dtype)
                for t in sig.object_outputs + sig.event_outputs}

    def split(self, outputs: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Per-event views of a call's outputs: ``[{name: rows of event i}, ...]``.

        >>> from coffea_sonic.core.tensors import ModelInfo, TensorInfo
        >>> info = ModelInfo("m", ("1",), "python", 8, (TensorInfo("x", "FP32", (-1,)),
        ...                  TensorInfo("x__counts", "INT64", (-1,))), (TensorInfo("y", "FP32", (-1,)),),
        ...                  ragged_inputs=("x", "x__counts"), ragged_outputs=("y",))
        >>> call = RaggedCall.build(info, {"x": np.arange(3, dtype=np.float32)}, [1, 0, 2])
        >>> [event["y"].tolist() for event in call.split({"y": np.arange(3.0)})]
        [[0.0], [], [1.0, 2.0]]
        """
        per_object = set(self.signature.object_output_names)
        return [{name: (array[self.offsets[i]:self.offsets[i + 1]] if name in per_object
                        else array[i]) for name, array in outputs.items()}
                for i in range(self.events)]
