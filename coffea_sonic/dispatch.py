"""The per-call machinery of a ``TritonModel`` in one process: :class:`CallRunner`.

It validates and splits a call, sends its pieces through a bounded window, retries transient
failures and puts the checked answers back in input order; its extension points are
:class:`~coffea_sonic.hooks.CallHooks`. How it works: docs/internals/dispatch.md.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from . import incidents
from . import ragged as ragged_module
from . import unserved
from .answers import assemble, check_outputs, check_version, preallocate
from .calls import Call, InferenceHandle, Piece, Window, check_piece, piece_tensors
from .core.tensors import ModelInfo
from .errors import InferenceError
from .hooks import CallHooks, PieceAnswer
from .retry import RetryPolicy, call_later
from .routing import Router
from .sizing import ShareSizer, server_requests
from .stats import InferenceStats
from .transport.base import InferAnswer, InferRequest
from .transport.errors import TransportError, to_sonic_error
from .transport.kinds import transport_kind
from .validation import NonFinitePolicy, empty_outputs, plan_pieces, validate_inputs
from .ramp import TailHold, ramped, tail_start

#: CallHooks and PieceAnswer live in :mod:`coffea_sonic.hooks` (importable from here too)
__all__ = ["CallHooks", "CallOwner", "CallRunner", "PieceAnswer"]

logger = logging.getLogger(__name__)

_call_ids = itertools.count(1)


class CallOwner(Protocol):
    """What the runner reads from its model (``TritonModel``'s public configuration)."""

    model_name: str
    timeout_s: float
    retry: RetryPolicy
    fallback: Any
    priority: int | None
    max_in_flight: int | None
    max_request_bytes: int | None
    nonfinite: NonFinitePolicy
    call_hooks: Sequence["CallHooks"]
    stats: InferenceStats


class CallRunner:
    """One model's calls in one process: window, pieces, retries, reassembly, statistics.

    ``router``: the servers (shared with every model of this process on them). ``info`` and
    ``version`` are set by the model once it knows them (:attr:`TritonModel.info`).
    """

    def __init__(self, owner: CallOwner, router: Router, *, version: str,
                 stats_lock: threading.Lock) -> None:
        self.owner = owner
        self.router = router
        self.pid = os.getpid()
        #: what the servers declare for the model, and the version every request names
        self.info: ModelInfo | None = None
        self.version = version
        #: the in-flight window, and the transport kind whose defaults sized it
        self.window: Window | None = None
        self.kind = ""
        self.lock = threading.Lock()
        self._stats_lock = stats_lock
        #: whether a waiting caller's ramped calls hold their last requests back
        self.tail_hold = TailHold()
        self.sizer = ShareSizer(lambda: server_requests(router, self.model_name, self.version,
                                                        owner.timeout_s))

    @property
    def model_name(self) -> str:
        return self.owner.model_name

    # -- the public interface of calls and handles ----------------------------------------------

    def count(self, **counts: float) -> None:
        """Add ``counts`` to the model's :class:`~coffea_sonic.stats.InferenceStats`."""
        stats = self.owner.stats
        with self._stats_lock:
            for name, value in counts.items():
                setattr(stats, name, getattr(stats, name) + value)

    def validate(self, info: ModelInfo, inputs: Mapping[str, Any], counts: Any, *,
                 per_piece: bool = False) -> tuple[dict[str, np.ndarray], int, Any]:
        """``(arrays, rows, ragged)``: the call's inputs checked against ``info`` (``counts``
        given: a ragged call); ``per_piece`` leaves the NaN/inf policy to :meth:`send`."""
        if counts is None:
            ragged_module.check_plain_call(info, inputs)
            arrays, rows = validate_inputs(info, inputs,
                                           "pass" if per_piece else self.owner.nonfinite)
            return arrays, rows, None
        ragged = ragged_module.RaggedCall.build(info, inputs, counts, self.owner.nonfinite)
        return ragged.arrays, ragged.events, ragged

    def send(self, info: ModelInfo, arrays: dict[str, np.ndarray], rows: int, ragged: Any,
             caller_waits: bool, *, per_piece: bool = False) -> InferenceHandle:
        """Split validated ``arrays`` into requests and start sending them; the call's handle.
        ``caller_waits``: a one-request call may be sent and answered in the calling thread.
        ``per_piece``: the NaN/inf policy is applied to each request's rows as it is made."""
        call = Call(call_id=next(_call_ids), arrays=arrays, rows=rows, runtime=self, info=info,
                    ragged=ragged, caller=threading.get_ident() if caller_waits else None,
                    chunk=incidents.current_chunk(),
                    nonfinite=self.owner.nonfinite if per_piece and ragged is None else "pass")
        if rows == 0:
            call.outputs = empty_outputs(info) if ragged is None else ragged.empty_outputs()
            call.done.set()
            return InferenceHandle(self, call)
        window, kind = self.sized_window()
        cap = self.owner.max_request_bytes or self.sizer.request_bytes(
            kind, self.owner.max_in_flight, self.owner.stats.requests, window)
        plan = plan_pieces(info, arrays, rows, cap) if ragged is None else ragged.plan(cap)
        plan, tail_from = self._ramped(call, plan, kind)
        call.pieces = [Piece(call, index, start, stop, pad)
                       for index, (start, stop, pad) in enumerate(plan)]
        if tail_from < len(plan) - 1 and caller_waits and self.tail_hold.next_call():
            # every halving piece but the first waits (ramp.TailHold)
            call.held, call.holds = call.pieces[tail_from + 1:], True
        call.results = [None] * len(call.pieces)
        call.remaining = len(call.pieces)
        call.out = preallocate(info, rows) if ragged is None else None
        for hook in self.owner.call_hooks:
            hook.on_call(call)
        held = set(map(id, call.held))
        window.submit([piece for piece in call.pieces
                       if id(piece) not in held and not self._looked_up(piece)])
        return InferenceHandle(self, call)

    def _ramped(self, call: Call, plan: list[tuple[int, int, int]], kind: str
                ) -> tuple[list[tuple[int, int, int]], int]:
        """A lone caller's plan over gRPC ramped (:mod:`coffea_sonic.ramp`), and the index of
        its first piece cut from the last request (``len(plan)``: not ramped)."""
        if not (call.ragged is None and kind == "grpc" and self.sizer.alone and len(plan) > 1
                and not self.owner.max_request_bytes and not any(pad for *_, pad in plan)):
            return plan, len(plan)
        row_bytes = max(1, sum(array.nbytes for array in call.arrays.values()) // call.rows)
        spans = ramped([(start, stop) for start, stop, _ in plan], row_bytes)
        return [(start, stop, 0) for start, stop in spans], tail_start(spans, plan[-1][0])

    def assemble(self, call: Call) -> dict[str, np.ndarray]:
        """The outputs of a finished call in input order (its pieces' bytes are let go)."""
        spans = [(piece.start, piece.stop) for piece in call.pieces]
        if call.ragged is not None:  # per-object and per-event outputs, checked there
            outputs = call.ragged.assemble(spans, call.results)
        else:
            outputs = assemble(self.model_name, call.info, call.rows, spans, call.results,
                               call.out)
        call.results, call.arrays = [], {}
        return outputs

    def cancel(self, call: Call, error: BaseException | None = None) -> None:
        """Fail ``call`` (cancelled by its caller unless ``error`` says otherwise) and cancel its
        requests in flight; its handle's ``result()`` raises the error."""
        self.fail(call, error or InferenceError(
            f"model {self.model_name!r}: call cancelled by the caller"))

    def fail(self, call: Call, error: BaseException) -> None:
        """Fail ``call`` with ``error`` (the first error wins) and cancel its requests."""
        with call.lock:
            if call.error is not None or call.done.is_set():
                return
            call.error = error
        for piece in call.pieces:
            future = piece.future
            if future is not None and not future.done():
                future.cancel()
        call.done.set()

    # -- the window and its transport ------------------------------------------------------------

    def sized_window(self) -> tuple[Window, str]:
        """The in-flight window, sized by the transport of the first usable server, and that
        transport's kind (whose defaults also cap a request's bytes)."""
        if self.window is None:
            with self.lock:
                if self.window is None:
                    kind = self.current_kind()
                    limit = self.owner.max_in_flight or transport_kind(kind).max_in_flight
                    self.kind = kind
                    self.window = Window(limit, self._start_piece)
        if self.kind == "shm" and self.on_gpu:
            self.kind = self.current_kind()  # known only once the model's info is
        return self.window, self.kind

    @property
    def on_gpu(self) -> bool:
        """Whether the server runs this model on its GPU 0 only (from its config; False if
        unknown): where CUDA shared memory may carry its tensors."""
        return bool(self.info is not None and self.info.on_gpu_zero)

    def current_kind(self) -> str:
        """The transport kind of requests to the first usable server ("grpc" if none is)."""
        endpoint = next((e for e in self.router.endpoints if e.healthy), None)
        if endpoint is None:
            return "grpc"
        return endpoint.transports.kind(self.on_gpu)

    # -- one piece's life ------------------------------------------------------------------------

    def _looked_up(self, piece: Piece) -> bool:
        """Whether a hook answered ``piece`` (then recorded, never sent)."""
        for hook in self.owner.call_hooks:
            produced = hook.lookup(piece)
            if produced is not None:
                try:
                    check_piece(piece)  # an answered piece's inputs obey the policy too
                    self._accept(piece, produced, "hook", self.version)
                except Exception as error:  # noqa: BLE001 - the call must learn about it
                    self.fail(piece.call, error)
                return True
        return False

    def _request(self, piece: Piece) -> InferRequest:
        """The request of ``piece`` (its tensors cut from the call's once, kept for retries)."""
        call = piece.call
        if piece.tensors is None:
            piece.tensors = piece_tensors(piece)
            piece.bytes_sent = sum(array.nbytes for array in piece.tensors.values())
        ragged = call.ragged  # one batch item per group; outputs shaped by its events
        request = InferRequest(
            self.model_name, self.version, piece.tensors,
            call.info.outputs if ragged is None else ragged.request_outputs(piece.start,
                                                                            piece.stop),
            rows=piece.rows + piece.pad if call.info.batching and ragged is None else None,
            timeout_s=self.owner.timeout_s, request_id=f"{call.call_id}.{piece.index}",
            out=({name: array[piece.start:piece.stop] for name, array in call.out.items()}
                 if call.out is not None else None), priority=self.owner.priority or 0,
            # started by the thread of a __call__ that only waits for this one request
            caller_waits=len(call.pieces) == 1 and call.caller == threading.get_ident())
        for hook in self.owner.call_hooks:
            request = hook.decorate(piece, request)
        return request

    def _start_piece(self, piece: Piece) -> None:
        call, window = piece.call, self.window
        if call.error is not None:  # the call already failed: don't send the rest
            window.release()
            return
        now = time.monotonic()
        if not piece.first_try:
            piece.first_try, piece.deadline = now, now + self.owner.retry.total_s
        endpoint = self.router.acquire(self.model_name, self.version, piece.avoid)
        if endpoint is None:
            window.release(pump=False)
            unserved.no_server(self, piece)
            return
        try:
            transport = endpoint.transports.data_transport(call.info.on_gpu_zero)
            request = self._request(piece)
            if piece.last_address and piece.last_address != endpoint.address:
                self.count(failovers=1)
                incidents.record("failover", server=endpoint.address, model=self.model_name,
                                 chunk=call.chunk, detail=f"from {piece.last_address}")
            piece.attempts += 1
            piece.endpoint, piece.last_address, piece.transport = endpoint, endpoint.address, transport
            piece.sent_at = time.perf_counter()
            future = transport.submit(request)
        except Exception as error:  # noqa: BLE001 - any failure to send fails the call
            self.router.release(endpoint, "other")
            window.release()
            self.fail(call, error)
            return
        piece.future = future
        future.add_done_callback(lambda done, piece=piece: self._on_answer(piece, done))

    def _on_answer(self, piece: Piece, future: Any) -> None:
        endpoint, window = piece.endpoint, self.window
        # the slot is freed before the caller is woken, so its next call starts in its own thread
        window.release(pump=False)
        try:
            if future.cancelled():
                self.router.release(endpoint, "other")
                return  # cancelled by fail(): the call already carries its error
            latency = time.perf_counter() - piece.sent_at
            error = future.exception()
            if error is None:
                self.router.release(endpoint, "ok")
                window.answered(overloaded=False)
                answer: InferAnswer = future.result()
                check_version(self.model_name, self.version, answer.model_version,
                              endpoint.address)
                if piece.index == len(piece.call.pieces) - 1 and piece.call.holds:
                    self.tail_hold.answered(latency)
                self._accept(piece, answer.outputs, endpoint.address,
                             answer.model_version or self.version, answer.delivered,
                             requests=1, bytes_sent=piece.bytes_sent,
                             bytes_received=answer.nbytes, latency_s=latency)
            elif not isinstance(error, TransportError):  # e.g. a malformed answer: never retried
                self.router.release(endpoint, "other")
                self.fail(piece.call, error)
            else:
                self._on_transport_error(piece, error)
        except Exception as error:  # noqa: BLE001 - never lose an error in a transport thread
            self.fail(piece.call, error)
        finally:
            window.pump()

    def _on_transport_error(self, piece: Piece, error: TransportError) -> None:
        """Decide on a failed request: resend it plainly, retry it, or fail the call."""
        endpoint, window = piece.endpoint, self.window
        if error.kind == "shm_region" and piece.transport.name in ("shm", "cuda"):
            # the server does not know our region (it restarted or had every region
            # unregistered; or a balancer sent the request elsewhere): probed again, it keeps
            # shared memory or gets plain requests from now on; not a failure
            self.router.release(endpoint, "other")
            if not error.repeated:  # one forgetting, however many requests were in flight
                endpoint.transports.region_forgotten(error.describe())
            piece.attempts -= 1
            window.submit_first([piece])
            return
        detail = error.describe()
        self.router.release(endpoint, error.outcome, detail)
        piece.errors[endpoint.address] = detail
        self.count(failed_requests=1)
        if not error.retryable:
            self.fail(piece.call, to_sonic_error(
                error, model=self.model_name, version=self.version, address=endpoint.address,
                credentials=endpoint.settings.credential_source()))
            return
        piece.quota_refusal = detail if error.over_quota else ""
        if error.outcome == "busy":
            window.answered(overloaded=True)
            # overload is not the server failing: bounded by time, not by attempts
            piece.busy_attempts += 1
            piece.attempts -= 1
        self._retry(piece, wait_s=error.retry_after_s)

    def _accept(self, piece: Piece, produced: Mapping[str, Any], source: str, version: str,
                delivered: frozenset[str] = frozenset(), **counts: float) -> None:
        """Check ``produced`` against the piece's request, count it, tell the hooks, record it."""
        call = piece.call
        if call.ragged is not None:
            outputs = call.ragged.check(piece.start, piece.stop, produced, source)
        else:
            outputs = check_outputs(self.model_name, call.info, produced,
                                    rows=piece.rows + piece.pad, source=source,
                                    delivered=delivered)
        self.count(rows=piece.rows, **counts)
        for hook in self.owner.call_hooks:
            hook.on_answer(PieceAnswer(piece, outputs, source, self.model_name, version))
        self._record(piece, outputs)

    def _record(self, piece: Piece, outputs: dict[str, np.ndarray]) -> None:
        call = piece.call
        with call.lock:
            if call.results[piece.index] is not None:  # a late duplicate answer: keep the first
                return
            if call.out is not None:
                for name, array in outputs.items():
                    target = call.out[name][piece.start:piece.stop]
                    if array is not target and not np.shares_memory(array, target):
                        np.copyto(target, array[: piece.rows], casting="safe")
            call.results[piece.index] = outputs
            call.remaining -= 1
            finished = call.remaining == 0 and call.error is None
        piece.tensors = None  # the request's bytes are no longer needed
        if finished:
            call.done.set()
        elif call.held:
            self._release_held(call)

    def _release_held(self, call: Call) -> None:
        """Send a call's held last pieces (the ramp's tail) once its other pieces are answered."""
        with call.lock:
            if call.error is not None or call.remaining > len(call.held):
                return
            held, call.held = call.held, []
        self.window.submit_first([piece for piece in held if not self._looked_up(piece)])

    # -- retries, no server, fallback ------------------------------------------------------------

    def _retry(self, piece: Piece, wait_s: float | None = None) -> None:
        """Send ``piece`` again after a backoff (at least ``wait_s``, what the server asked for,
        but not past the deadline), elsewhere if possible; or give it up."""
        policy = self.owner.retry
        now = time.monotonic()
        if piece.attempts >= policy.max_attempts or now >= piece.deadline:
            unserved.give_up(self, piece,
                             f"{piece.attempts + piece.busy_attempts} attempt(s) failed")
            return
        piece.avoid = frozenset({piece.last_address})
        self.count(retries=1)
        incidents.record("retried", server=piece.last_address, model=self.model_name,
                         chunk=piece.call.chunk, detail=piece.errors.get(piece.last_address, ""))
        delay = policy.backoff_s(max(1, piece.attempts + piece.busy_attempts))
        if wait_s is not None:
            delay = min(max(delay, wait_s), piece.deadline - now)
        logger.info("coffea-sonic: retrying %s rows %d-%d in %.2f s (attempt %d failed at %s: %s)",
                    self.model_name, piece.start, piece.stop, delay, piece.attempts,
                    piece.last_address, piece.errors.get(piece.last_address, "?"))
        call_later(delay, lambda: self.window.submit_first([piece]))

    def _what(self) -> str:
        return f"model {self.model_name!r}" + (f" version {self.version}" if self.version else "")
