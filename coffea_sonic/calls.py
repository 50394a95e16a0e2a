"""The bookkeeping of one ``TritonModel`` call: pieces (requests), the call, its handle, the window.

How it works, with examples: docs/internals/dispatch.md.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .core.tensors import ModelInfo
from .validation import check_finite_rows, piece_arrays

__all__ = ["Call", "InferenceHandle", "Piece", "Window", "piece_tensors"]


@dataclass(eq=False)
class Piece:
    """One request: rows ``start:stop`` of a call, plus ``pad`` zero rows."""

    call: "Call"
    index: int
    start: int
    stop: int
    pad: int
    future: Any = None
    sent_at: float = 0.0
    #: sends so far, when the first one was tried, and the last retry deadline
    attempts: int = 0
    busy_attempts: int = 0
    deadline: float = 0.0
    first_try: float = 0.0
    #: the server (:class:`~coffea_sonic.endpoints.Endpoint`) of the last send
    endpoint: Any = None
    last_address: str = ""
    avoid: frozenset[str] = frozenset()
    #: the piece's input arrays (views of the call's), kept for retries
    tensors: Any = None
    #: the transport of the last send
    transport: Any = None
    bytes_sent: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    #: the last send's refusal by a quota (a gateway's RESOURCE_EXHAUSTED with a reason):
    #: retried until the deadline, then the call fails naming it (never the fallback)
    quota_refusal: str = ""
    #: whether its wait for a server to come back was logged (once per piece)
    waiting_logged: bool = False

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(eq=False)
class Call:
    """State shared by the pieces of one ``infer_async`` call."""

    call_id: int
    arrays: dict[str, np.ndarray]
    rows: int
    #: the :class:`~coffea_sonic.dispatch.CallRunner` that runs it
    runtime: Any
    info: ModelInfo
    pieces: list[Piece] = field(default_factory=list)
    results: list[dict[str, np.ndarray] | None] = field(default_factory=list)
    #: the call's output arrays, preallocated when every output has fixed dims: each piece's
    #: answer is written straight into its rows (None: outputs are concatenated at the end)
    out: dict[str, np.ndarray] | None = None
    #: a ragged call's events and groups (:class:`coffea_sonic.ragged.RaggedCall`); rows are events
    ragged: Any = None
    remaining: int = 0
    error: BaseException | None = None
    outputs: dict[str, np.ndarray] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the thread that waits for the call's answer (``TritonModel.__call__``), or None
    caller: int | None = None
    #: some rows were computed by the in-process fallback engine
    fallback: bool = False
    #: the chunk being processed when the call was made (its incidents name it)
    chunk: str = ""
    #: per-call metadata for the call hooks (:class:`~coffea_sonic.dispatch.CallHooks`)
    context: dict[str, Any] = field(default_factory=dict)
    #: the NaN/inf policy still to apply, to each piece's rows as it is made ("pass": the
    #: whole call was looked at when it was validated, or is not to be)
    nonfinite: str = "pass"
    #: its last pieces, held back until its other pieces are answered
    #: (:class:`~coffea_sonic.ramp.TailHold`); ``holds``: it held some
    held: list[Piece] = field(default_factory=list)
    holds: bool = False


class InferenceHandle:
    """The pending result of :meth:`TritonModel.infer_async`; ``result()`` gives the outputs.

    ``result(timeout)`` raises ``TimeoutError`` if not done in time (the requests go on), or the
    error that failed the call. A call gets all its outputs or raises: never partial outputs.
    """

    def __init__(self, control: Any, call: Call) -> None:
        #: the :class:`~coffea_sonic.dispatch.CallRunner` of the call (its ``model_name``,
        #: ``count``, ``assemble`` and ``cancel``)
        self._control = control
        self._call = call
        self._assembled: dict[str, np.ndarray] | None = call.outputs

    def done(self) -> bool:
        """True once every request of the call is answered (or one failed)."""
        return self._call.done.is_set()

    def result(self, timeout: float | None = None) -> dict[str, np.ndarray]:
        """``{output name: array}`` with rows in input order; blocks until available."""
        call = self._call
        if not call.done.is_set():
            began = time.perf_counter()
            finished = call.done.wait(timeout)
            self._control.count(wait_s=time.perf_counter() - began)
            if not finished:
                raise TimeoutError(
                    f"model {self._control.model_name!r}: {call.rows} rows not answered within "
                    f"{timeout} s (requests still running)")
        if call.error is not None:
            raise call.error
        if self._assembled is None:
            self._assembled = self._control.assemble(call)
        return self._assembled

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error that failed the call, or None once it succeeded."""
        if not self._call.done.wait(timeout):
            raise TimeoutError(f"model {self._control.model_name!r}: call not done within {timeout} s")
        return self._call.error

    def cancel(self) -> None:
        """Stop sending this call's remaining requests; ``result()`` then raises."""
        self._control.cancel(self._call)


class Window:
    """At most ``limit`` requests in flight; the rest wait in FIFO order (retries first). The
    limit adapts to overload like TCP's congestion window (docs/internals/dispatch.md)."""

    def __init__(self, limit: int, start: Callable[[Piece], None]) -> None:
        self._max_limit = limit
        self._limit = float(limit)
        self._start = start
        self._in_flight = 0
        self._queue: deque[Piece] = deque()
        self._lock = threading.Lock()

    def submit(self, pieces: Sequence[Piece]) -> None:
        with self._lock:
            self._queue.extend(pieces)
        self.pump()

    def submit_first(self, pieces: Sequence[Piece]) -> None:
        """Queue ``pieces`` ahead of every waiting piece, in their order."""
        with self._lock:
            self._queue.extendleft(reversed(pieces))
        self.pump()

    def release(self, pump: bool = True) -> None:
        """Free one slot; start waiting pieces now unless ``pump`` is False (call pump later)."""
        with self._lock:
            self._in_flight -= 1
        if pump:
            self.pump()

    def answered(self, overloaded: bool) -> None:
        """Adapt the limit to an answer: halve on overload, grow slowly on success."""
        with self._lock:
            if overloaded:
                self._limit = max(1.0, self._limit / 2)
            elif self._limit < self._max_limit:
                self._limit = min(float(self._max_limit), self._limit + 1.0 / self._limit)

    def pump(self) -> None:
        while True:
            with self._lock:
                if self._in_flight >= int(self._limit) or not self._queue:
                    return
                piece = self._queue.popleft()
                self._in_flight += 1
            # started outside the lock: starting may complete (and release) synchronously
            self._start(piece)

    def resize(self, limit: int) -> None:
        """Make ``limit`` the most requests in flight (from now on; requests in flight over it
        finish)."""
        with self._lock:
            if limit == self._max_limit:
                return
            grew = limit > self._max_limit
            self._max_limit = limit
            self._limit = float(limit) if grew else min(self._limit, float(limit))
        self.pump()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def limit(self) -> int:
        return int(self._limit)


def check_piece(piece: Piece) -> None:
    """Apply the call's NaN/inf policy still pending to ``piece``'s rows (raises
    ``InputValidationError`` naming the model and tensor, which fails the whole call)."""
    call = piece.call
    if call.nonfinite != "pass" and call.ragged is None:
        check_finite_rows(call.info.name, call.arrays, piece.start, piece.stop,
                          call.nonfinite)  # type: ignore[arg-type]


def piece_tensors(piece: Piece) -> dict[str, np.ndarray]:
    """The input tensors of ``piece``: its rows (plus padding), or its group of ragged events;
    its rows are checked first (:func:`check_piece`)."""
    call = piece.call
    check_piece(piece)
    if call.ragged is not None:
        return call.ragged.tensors(piece.start, piece.stop)
    return piece_arrays(call.arrays, piece.start, piece.stop, piece.pad)

