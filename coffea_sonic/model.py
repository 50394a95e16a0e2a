"""``TritonModel``: a picklable client of one model served by Triton over gRPC.

Drop-in for ``coffea.ml_tools.triton_wrapper`` URLs (``triton+grpc://host:port/model[/version]``,
``triton+grpcs://`` for TLS), but a call is validated on the client, split by ``max_batch_size``
and by bytes, sent as concurrent requests through a bounded in-flight window, and reassembled once
in input order. ``infer_async`` sends at once and returns a handle, so CPU work overlaps the
request (SONIC's acquire/produce).

>>> from coffea_sonic.model import TritonModel
>>> model = TritonModel("triton+grpc://127.0.0.1:8001/jet_tagger/1", timeout_s=30)
>>> model
TritonModel('triton+grpc://127.0.0.1:8001/jet_tagger/1', timeout_s=30, max_in_flight=4)
>>> import pickle
>>> pickle.loads(pickle.dumps(model)).url
'triton+grpc://127.0.0.1:8001/jet_tagger/1'

With a server running (``LocalTritonServer``)::

    outputs = model({"features": features})            # dict of numpy arrays, input order
    handle = model.infer_async({"features": features})  # sends now
    ...                                                  # other work for this chunk
    probs = handle.result()["probs"]

Policies (see the README section "Talking to Triton"):

* dtypes: only numpy-'safe' casts are done silently; anything lossy raises ``InputValidationError``.
* NaN/inf: passed through by default (the model sees what the in-process model would);
  ``nonfinite="raise"`` rejects them.
* Empty inputs: no request; correctly shaped, typed empty outputs.
* Connection: never pickled; one gRPC channel per process and server, made after any fork.
* Secrets: header values are :class:`~coffea_sonic.transport.Secret` (redacted in reprs, never
  pickled in clear; use ``Secret.bearer_from_env("NAME")`` for Dask workers).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .errors import ConfigurationError, InferenceError, ModelNotFoundError
from .stats import InferenceStats, ServerStatistics
from .transport.channel import Connection, get_connection
from .transport.codec import decode_response, encode_request
from .transport.metadata import ModelInfo, fetch_model_info
from .transport.secrets import Secret, header_fingerprint, normalize_headers, resolve_headers
from .transport.status import as_sonic_error
from .transport.tls import TlsOptions
from .transport.url import ModelRef, parse_model_url
from .transport.validation import (GRPC_MESSAGE_LIMIT, NonFinitePolicy, empty_outputs, piece_arrays, plan_pieces,
                                   validate_inputs)

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "InferenceHandle", "TritonModel"]

logger = logging.getLogger(__name__)

#: Default cap on one request's tensor bytes: far below gRPC's 2 GiB, big enough to be efficient.
DEFAULT_MAX_REQUEST_BYTES = 64 * 2**20

_call_ids = itertools.count(1)


@dataclass(eq=False)
class _Piece:
    """One request: rows ``start:stop`` of a call, plus ``pad`` zero rows."""

    call: "_Call"
    index: int
    start: int
    stop: int
    pad: int
    future: Any = None
    sent_at: float = 0.0

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(eq=False)
class _Call:
    """State shared by the pieces of one ``infer_async`` call."""

    call_id: int
    arrays: dict[str, np.ndarray]
    rows: int
    runtime: "_Runtime"
    info: ModelInfo
    pieces: list[_Piece] = field(default_factory=list)
    results: list[dict[str, np.ndarray] | None] = field(default_factory=list)
    remaining: int = 0
    error: BaseException | None = None
    outputs: dict[str, np.ndarray] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


class InferenceHandle:
    """The pending result of :meth:`TritonModel.infer_async`; ``result()`` gives the outputs.

    ``result(timeout)`` raises ``TimeoutError`` if not done in time (the requests go on), or the
    error that failed the call. A call gets all its outputs or raises: never partial outputs.
    """

    def __init__(self, model: "TritonModel", call: _Call) -> None:
        self._model = model
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
            self._model._add_stats(wait_s=time.perf_counter() - began)
            if not finished:
                raise TimeoutError(
                    f"model {self._model.model_name!r}: {call.rows} rows not answered within "
                    f"{timeout} s (requests still running)")
        if call.error is not None:
            raise call.error
        if self._assembled is None:
            self._assembled = self._model._assemble(call)
        return self._assembled

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error that failed the call, or None once it succeeded."""
        if not self._call.done.wait(timeout):
            raise TimeoutError(f"model {self._model.model_name!r}: call not done within {timeout} s")
        return self._call.error

    def cancel(self) -> None:
        """Stop sending this call's remaining requests; ``result()`` then raises."""
        self._model._fail(self._call, InferenceError(
            f"model {self._model.model_name!r}: call cancelled by the caller"))


class _Window:
    """At most ``limit`` requests in flight; the rest wait in FIFO order."""

    def __init__(self, limit: int, start: Callable[[_Piece], None]) -> None:
        self._limit = limit
        self._start = start
        self._in_flight = 0
        self._queue: deque[_Piece] = deque()
        self._lock = threading.Lock()

    def submit(self, pieces: Sequence[_Piece]) -> None:
        with self._lock:
            self._queue.extend(pieces)
        self.pump()

    def release(self, pump: bool = True) -> None:
        """Free one slot; start waiting pieces now unless ``pump`` is False (call pump later)."""
        with self._lock:
            self._in_flight -= 1
        if pump:
            self.pump()

    def pump(self) -> None:
        while True:
            with self._lock:
                if self._in_flight >= self._limit or not self._queue:
                    return
                piece = self._queue.popleft()
                self._in_flight += 1
            # started outside the lock: starting may complete (and release) synchronously
            self._start(piece)

    @property
    def in_flight(self) -> int:
        return self._in_flight


@dataclass(eq=False)
class _Runtime:
    """What a TritonModel holds in one process (never pickled)."""

    pid: int
    connection: Connection
    metadata: tuple[tuple[str, str], ...]
    window: _Window
    info: ModelInfo | None = None


class TritonModel:
    """Client of one Triton model: validated, split, pipelined gRPC inference on numpy dicts.

    Parameters
    ----------
    url:
        ``triton+grpc://host:port/model[/version]`` (``triton+grpcs://`` for TLS); no version
        means the latest the server has.
    timeout_s:
        Deadline of each request. ``connect_timeout_s``: how long to wait for the first
        connection.
    max_in_flight:
        Requests of this model in flight at once (per process); more pieces queue.
    ssl:
        ``True`` (system CA roots), a mapping or :class:`~coffea_sonic.transport.TlsOptions`
        (CA bundle, client certificate and key for mutual TLS, server-name override).
    headers:
        Sent with every request, e.g. ``{"authorization": Secret.bearer_from_env("TOKEN")}``.
        Sensitive plain-string values (authorization, token, key, ...) are wrapped in
        :class:`~coffea_sonic.transport.Secret` automatically.
    max_request_bytes:
        Cap on one request's tensor bytes (calls are split by rows to stay under it).
    nonfinite:
        ``"pass"`` (default) sends NaN/inf as given; ``"raise"`` rejects them.
    expected_checksum:
        If set, the served model's signature checksum (``model.info.checksum``) must equal it.

    >>> TritonModel("triton+grpc://127.0.0.1:8001/jet_tagger").version
    ''
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 60.0,
        max_in_flight: int = 4,
        ssl: TlsOptions | Mapping[str, Any] | bool | None = None,
        headers: Mapping[str, str | Secret] | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        connect_timeout_s: float = 10.0,
        nonfinite: NonFinitePolicy = "pass",
        expected_checksum: str | None = None,
    ) -> None:
        self._ref: ModelRef = parse_model_url(url)
        self.url = url
        if timeout_s is None or not timeout_s > 0:
            raise ConfigurationError(f"timeout_s must be > 0 seconds, not {timeout_s!r}")
        if connect_timeout_s is None or not connect_timeout_s > 0:
            raise ConfigurationError(f"connect_timeout_s must be > 0, not {connect_timeout_s!r}")
        if not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ConfigurationError(f"max_in_flight must be an int >= 1, not {max_in_flight!r}")
        if not isinstance(max_request_bytes, int) or not (
                1 <= max_request_bytes <= GRPC_MESSAGE_LIMIT - (1 << 20)):
            raise ConfigurationError(
                "max_request_bytes must be an int between 1 and gRPC's 2 GiB message limit "
                f"(less 1 MiB framing), not {max_request_bytes!r}")
        if nonfinite not in ("pass", "raise"):
            raise ConfigurationError(f"nonfinite must be 'pass' or 'raise', not {nonfinite!r}")
        tls = TlsOptions.coerce(ssl)
        if self._ref.tls and tls is None:
            if ssl is False:
                raise ConfigurationError(f"{url!r} asks for TLS (triton+grpcs) but ssl=False")
            tls = TlsOptions()
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.max_in_flight = max_in_flight
        self.max_request_bytes = max_request_bytes
        self.nonfinite = nonfinite
        self.expected_checksum = expected_checksum
        self.tls = tls
        self.headers = normalize_headers(headers)
        self._init_runtime_fields()

    def _init_runtime_fields(self) -> None:
        self.stats = InferenceStats()
        self._stats_lock = threading.Lock()
        self._runtime_lock = threading.Lock()
        self._runtime: _Runtime | None = None

    # -- identity -------------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self._ref.model

    @property
    def version(self) -> str:
        """The pinned version, or ``""`` for the latest."""
        return self._ref.version

    @property
    def address(self) -> str:
        return self._ref.address

    def __repr__(self) -> str:
        extras = [f"timeout_s={self.timeout_s:g}", f"max_in_flight={self.max_in_flight}"]
        if self.headers:
            extras.append(f"headers={sorted(self.headers)}")
        if self.tls is not None and not self._ref.tls:
            extras.append("ssl=True")
        return f"TritonModel({self.url!r}, {', '.join(extras)})"

    # -- pickling: configuration only -------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("stats", "_stats_lock", "_runtime_lock", "_runtime"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # counters start at zero in every copy, so summing per-chunk stats never double counts
        self._init_runtime_fields()

    # -- per-process runtime ------------------------------------------------------------------------

    def _get_runtime(self) -> _Runtime:
        runtime = self._runtime
        pid = os.getpid()
        if runtime is not None and runtime.pid == pid:
            return runtime
        with self._runtime_lock:
            runtime = self._runtime
            if runtime is None or runtime.pid != pid:
                metadata = resolve_headers(self.headers)
                connection = get_connection(self.address, self.tls,
                                            header_fingerprint(self.headers) if self.headers else "")
                runtime = _Runtime(pid=pid, connection=connection, metadata=metadata,
                                   window=_Window(self.max_in_flight, self._start_piece))
                self._runtime = runtime
            return runtime

    @property
    def info(self) -> ModelInfo:
        """What the server declares for this model (fetched once per process, then cached)."""
        runtime = self._get_runtime()
        if runtime.info is None:
            runtime.connection.wait_ready(self.connect_timeout_s)
            info = fetch_model_info(runtime.connection, self.model_name, self.version,
                                    timeout_s=self.timeout_s, metadata=runtime.metadata)
            if self.version and self.version not in info.versions:
                raise ModelNotFoundError(
                    f"Triton at {self.address} serves model {self.model_name!r} versions "
                    f"{list(info.versions)}, not the pinned version {self.version}")
            if self.expected_checksum and info.checksum != self.expected_checksum:
                raise InferenceError(
                    f"model {self.model_name!r} at {self.address} has signature checksum "
                    f"{info.checksum}, expected {self.expected_checksum}: the served model is not "
                    f"the one this analysis was written for ({info.describe()})")
            runtime.info = info
        return runtime.info

    # -- inference ----------------------------------------------------------------------------------

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run the model on ``{input name: array}``; returns ``{output name: array}``."""
        return self.infer_async(inputs).result()

    def infer_async(self, inputs: Mapping[str, Any]) -> InferenceHandle:
        """Validate and send now; the handle's ``result()`` gives what ``__call__`` would."""
        info = self.info
        runtime = self._get_runtime()
        arrays, rows = validate_inputs(info, inputs, self.nonfinite)
        call = _Call(call_id=next(_call_ids), arrays=arrays, rows=rows, runtime=runtime, info=info)
        self._add_stats(calls=1)
        if rows == 0:
            call.outputs = empty_outputs(info)
            call.done.set()
            return InferenceHandle(self, call)
        plan = plan_pieces(info, arrays, rows, self.max_request_bytes)
        call.pieces = [_Piece(call, index, start, stop, pad)
                       for index, (start, stop, pad) in enumerate(plan)]
        call.results = [None] * len(call.pieces)
        call.remaining = len(call.pieces)
        runtime.window.submit(call.pieces)
        return InferenceHandle(self, call)

    def _start_piece(self, piece: _Piece) -> None:
        call = piece.call
        runtime = call.runtime
        if call.error is not None:  # the call already failed: don't send the rest
            runtime.window.release()
            return
        try:
            request = encode_request(
                self.model_name, self.version,
                piece_arrays(call.arrays, piece.start, piece.stop, piece.pad),
                request_id=f"{call.call_id}.{piece.index}")
            bytes_sent = sum(len(raw) for raw in request.raw_input_contents)
            piece.sent_at = time.perf_counter()
            future = runtime.connection.stub.ModelInfer.future(
                request, timeout=self.timeout_s, metadata=runtime.metadata)
        except Exception as error:  # noqa: BLE001 - any failure to send fails the call
            runtime.window.release()
            self._fail(call, error)
            return
        piece.future = future
        future.add_done_callback(lambda done, piece=piece, size=bytes_sent:
                                 self._on_answer(piece, done, size))

    def _on_answer(self, piece: _Piece, future: Any, bytes_sent: int) -> None:
        call = piece.call
        window = call.runtime.window
        # the slot is freed before the caller is woken, so its next call starts in its own thread
        window.release(pump=False)
        try:
            if future.cancelled():
                return  # cancelled by _fail: the call already carries its error
            latency = time.perf_counter() - piece.sent_at
            error = future.exception()
            if error is not None:
                self._add_stats(failed_requests=1)
                self._fail(call, as_sonic_error(error, model=self.model_name,
                                                version=self.version, address=self.address))
                return
            response = future.result()
            outputs = self._check_response(call.info, piece, response)
            bytes_received = sum(len(raw) for raw in response.raw_output_contents)
            self._add_stats(requests=1, rows=piece.rows, bytes_sent=bytes_sent,
                            bytes_received=bytes_received, latency_s=latency)
            with call.lock:
                call.results[piece.index] = outputs
                call.remaining -= 1
                finished = call.remaining == 0 and call.error is None
            if finished:
                call.done.set()
        except Exception as error:  # noqa: BLE001 - never lose an error in a gRPC thread
            self._fail(call, error)
        finally:
            window.pump()

    def _check_response(self, info: ModelInfo, piece: _Piece,
                        response: Any) -> dict[str, np.ndarray]:
        if self.version and response.model_version and response.model_version != self.version:
            raise InferenceError(
                f"model {self.model_name!r}: pinned version {self.version} but {self.address} "
                f"answered with version {response.model_version}")
        outputs = decode_response(response)
        missing = [name for name in info.output_names if name not in outputs]
        if missing:
            raise InferenceError(
                f"model {self.model_name!r} at {self.address}: response lacks outputs {missing} "
                f"(got {sorted(outputs)})")
        sent_rows = piece.rows + piece.pad
        for tensor in info.outputs:
            array = outputs[tensor.name]
            if array.ndim == 0 or array.shape[0] != sent_rows:
                raise InferenceError(
                    f"model {self.model_name!r} at {self.address}: output {tensor.name!r} has "
                    f"shape {list(array.shape)} for a request of {sent_rows} rows; refusing "
                    "misaligned outputs")
            if array.dtype != tensor.dtype:
                raise InferenceError(
                    f"model {self.model_name!r} output {tensor.name!r}: server sent "
                    f"{array.dtype}, config declares {tensor.dtype}")
        return {name: outputs[name] for name in info.output_names}

    def _fail(self, call: _Call, error: BaseException) -> None:
        with call.lock:
            if call.error is not None or call.done.is_set():
                return
            call.error = error
        for piece in call.pieces:
            future = piece.future
            if future is not None and not future.done():
                future.cancel()
        call.done.set()

    def _assemble(self, call: _Call) -> dict[str, np.ndarray]:
        """Concatenate the pieces' outputs in input order (the one copy of the output bytes)."""
        outputs: dict[str, np.ndarray] = {}
        for name in call.info.output_names:
            parts = [result[name][: piece.rows]
                     for piece, result in zip(call.pieces, call.results)]
            outputs[name] = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
        total = sum(len(part) for part in outputs.values()) // max(len(outputs), 1)
        if total != call.rows:  # cannot happen unless a piece was lost: never hand it out
            raise InferenceError(
                f"model {self.model_name!r}: assembled {total} rows for {call.rows} inputs")
        call.results = []  # the response bytes are no longer needed
        call.arrays = {}
        return outputs

    def _add_stats(self, **counts: float) -> None:
        with self._stats_lock:
            for name, value in counts.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)

    # -- server-side statistics -------------------------------------------------------------------

    def server_statistics(self) -> ServerStatistics:
        """Triton's cumulative statistics for this model (all versions unless pinned)."""
        import grpc
        from tritonclient.grpc import service_pb2

        runtime = self._get_runtime()
        try:
            response = runtime.connection.stub.ModelStatistics(
                service_pb2.ModelStatisticsRequest(name=self.model_name, version=self.version),
                timeout=self.timeout_s, metadata=runtime.metadata)
        except grpc.RpcError as error:
            raise as_sonic_error(error, model=self.model_name, version=self.version,
                                 address=self.address) from None
        return ServerStatistics.from_model_stats(response.model_stats)

    @contextlib.contextmanager
    def measure_server(self) -> Iterator["ServerDelta"]:
        """Server-side work done while the block runs (queue and compute time, batches).

        ::

            with model.measure_server() as measured:
                model(inputs)
            measured.delta.queue_s, measured.delta.average_batch
        """
        measured = ServerDelta(before=self.server_statistics())
        try:
            yield measured
        finally:
            measured.delta = self.server_statistics() - measured.before


@dataclass
class ServerDelta:
    """Holder filled by :meth:`TritonModel.measure_server` when its block ends."""

    before: ServerStatistics
    delta: ServerStatistics = field(default_factory=ServerStatistics)
