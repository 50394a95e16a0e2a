"""``TritonModel``: a picklable client of one model served by one or several Triton servers.

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
>>> TritonModel(["triton+grpc://gpu1:8001/jet_tagger", "triton+grpc://gpu2:8001/jet_tagger"]).addresses
['gpu1:8001', 'gpu2:8001']

With a server running (``LocalTritonServer``)::

    outputs = model({"features": features})            # dict of numpy arrays, input order
    handle = model.infer_async({"features": features})  # sends now
    ...                                                  # other work for this chunk
    probs = handle.result()["probs"]

Policies:

* dtypes: only numpy-'safe' casts are done silently; anything lossy raises ``InputValidationError``.
* NaN/inf: passed through by default (the model sees what the in-process model would);
  ``nonfinite="raise"`` rejects them.
* Empty inputs: no request; correctly shaped, typed empty outputs.
* Integrity: every answer's row count, outputs and dtypes are checked against its request; a call
  gets all its outputs, in order, or raises — never a partial or misaligned result.
* Several servers (a list of URLs): least-outstanding balancing, quarantine of failed servers,
  retries of transient failures (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``RESOURCE_EXHAUSTED``,
  resets) with backoff on another server, never of ``INVALID_ARGUMENT``/``NOT_FOUND``/validation
  errors; optional in-process fallback (see :mod:`coffea_sonic.routing`,
  :mod:`coffea_sonic.transport.fallback`).
* Versions: an unpinned URL is resolved once per process to the highest version served, and every
  request names it; a pinned version must be the one that answers.
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

from .errors import (ConfigurationError, InferenceError, ModelNotFoundError,
                     ServerUnavailableError)
from .routing import Endpoint, RetryPolicy, Router, call_later, get_router
from .stats import InferenceStats, ServerStatistics
from .transport import fallback as fallback_module
from .transport.codec import decode_response, encode_request
from .transport.metadata import ModelInfo, TensorInfo
from .transport.secrets import Secret, header_fingerprint, normalize_headers, resolve_headers
from .transport.shm import select_transport, shared_transport
from .transport.status import as_sonic_error, describe, is_retryable, server_outcome
from .transport.tls import TlsOptions
from .transport.url import ModelRef, parse_model_url
from .transport.validation import (GRPC_MESSAGE_LIMIT, NonFinitePolicy, empty_outputs,
                                   piece_arrays, plan_pieces, validate_inputs)

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "InferenceHandle", "ServerDelta", "TritonModel"]

logger = logging.getLogger(__name__)

#: Default cap on one request's tensor bytes. Measured on the H100 (benchmarks/RESULTS.md):
#: Python gRPC moves a 38 MB request at 0.25 GB/s but 2.4 MB ones at 1.2 GB/s, and four 38 MB
#: requests in flight cost 2.5x their bytes in client memory; a few MiB keeps both in check while
#: a whole jet_tagger max batch (65 536 rows, 1.5 MB) still fits in one request.
DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20

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
    #: sends so far, when the first one was tried, and the last retry deadline
    attempts: int = 0
    busy_attempts: int = 0
    deadline: float = 0.0
    first_try: float = 0.0
    endpoint: Endpoint | None = None
    last_address: str = ""
    avoid: frozenset[str] = frozenset()
    #: the encoded request (gRPC) or the piece's arrays (shared memory), kept for retries
    request: Any = None
    tensors: Any = None
    bytes_sent: int = 0
    errors: dict[str, str] = field(default_factory=dict)

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
    """At most ``limit`` requests in flight; the rest wait in FIFO order (retries first).

    The limit adapts like TCP's congestion window: an overloaded answer (queue full) halves it,
    down to one; each good answer grows it back by about one per window, up to ``limit``. So a
    client backs off from a saturated server instead of hammering its queue.
    """

    def __init__(self, limit: int, start: Callable[[_Piece], None]) -> None:
        self._max_limit = limit
        self._limit = float(limit)
        self._start = start
        self._in_flight = 0
        self._queue: deque[_Piece] = deque()
        self._lock = threading.Lock()

    def submit(self, pieces: Sequence[_Piece]) -> None:
        with self._lock:
            self._queue.extend(pieces)
        self.pump()

    def submit_front(self, piece: _Piece) -> None:
        with self._lock:
            self._queue.appendleft(piece)
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

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def limit(self) -> int:
        return int(self._limit)


@dataclass(eq=False)
class _Runtime:
    """What a TritonModel holds in one process (never pickled)."""

    pid: int
    router: Router
    metadata: tuple[tuple[str, str], ...]
    window: _Window
    info: ModelInfo | None = None
    #: the version every request names ("" only when no server could be asked)
    version: str = ""


def _configured_tls() -> TlsOptions:
    """TLS options for ``triton+grpcs://`` URLs from the settings ``ca_file``, ``cert_file``,
    ``key_file``, ``server_name`` (``COFFEA_SONIC_CA_FILE``..., Dask config, facility file)."""
    from . import config

    return TlsOptions.coerce({
        "root_certificates": config.setting("ca_file"),
        "certificate_chain": config.setting("cert_file"),
        "private_key": config.setting("key_file"),
        "server_name": config.setting("server_name"),
    })


def _configured_headers() -> dict[str, str | Secret]:
    """``authorization: Bearer <token>`` when the settings ``token_env`` (the NAME of the variable
    holding the token) or ``token_file`` are set; only the name or path is ever kept."""
    from . import config

    token_file = config.setting("token_file")
    if token_file:
        return {"authorization": Secret.from_file(token_file, prefix="Bearer ")}
    token_env = config.setting("token_env")
    if token_env:
        return {"authorization": Secret.bearer_from_env(str(token_env))}
    return {}


def _zoo_info(model: str) -> ModelInfo | None:
    """The zoo's declaration of ``model`` as a ModelInfo (used when no server can describe it)."""
    from . import zoo

    if model not in zoo.names():
        return None
    spec = zoo.spec(model)

    def tensors(declared) -> tuple[TensorInfo, ...]:
        return tuple(TensorInfo(t.name, t.triton_dtype.removeprefix("TYPE_"), tuple(t.dims))
                     for t in declared)

    return ModelInfo(name=model, versions=("1",), platform="python",
                     max_batch_size=spec.max_batch_size, inputs=tensors(spec.inputs),
                     outputs=tensors(spec.outputs))


class TritonModel:
    """Client of one Triton model: validated, split, pipelined gRPC inference on numpy dicts.

    Parameters
    ----------
    url:
        ``triton+grpc://host:port/model[/version]`` (``triton+grpcs://`` for TLS), or a list of
        such URLs of the same model on several servers. No version means the latest served.
    timeout_s:
        Deadline of each request (a slower server is given up on and the request retried
        elsewhere). ``connect_timeout_s``: how long to wait for a server to answer at all.
    max_in_flight:
        Requests of this model in flight at once (per process and model object); more queue.
    ssl:
        ``True`` (system CA roots), a mapping or :class:`~coffea_sonic.transport.TlsOptions`
        (CA bundle, client certificate and key for mutual TLS, server-name override). None:
        ``triton+grpcs://`` URLs use the settings ``ca_file``, ``cert_file``, ``key_file``,
        ``server_name`` (``COFFEA_SONIC_CA_FILE``, ...) or the system roots.
    headers:
        Sent with every request, e.g. ``{"authorization": Secret.bearer_from_env("TOKEN")}``.
        Sensitive plain-string values (authorization, token, key, ...) are wrapped in
        :class:`~coffea_sonic.transport.Secret` automatically. None: a bearer token from the
        settings ``token_env`` (``COFFEA_SONIC_TOKEN_ENV=NAME``) or ``token_file``, if set.
    max_request_bytes:
        Cap on one request's tensor bytes (calls are split by rows to stay under it).
    nonfinite:
        ``"pass"`` (default) sends NaN/inf as given; ``"raise"`` rejects them.
    expected_checksum:
        If set, every server's signature checksum of the model (``model.info.checksum``) must
        equal it.
    retry:
        :class:`~coffea_sonic.routing.RetryPolicy` or a mapping of its fields (attempts, total
        time, backoff, quarantine).
    fallback:
        ``"off"``, ``"cpu"``, ``"local"`` or a factory ``f(model) -> engine``; None reads the
        ``fallback`` setting (``COFFEA_SONIC_FALLBACK``, default off). See
        :mod:`coffea_sonic.transport.fallback`.

    >>> TritonModel("triton+grpc://127.0.0.1:8001/jet_tagger").version
    ''
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        timeout_s: float = 60.0,
        max_in_flight: int = 4,
        ssl: TlsOptions | Mapping[str, Any] | bool | None = None,
        headers: Mapping[str, str | Secret] | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        connect_timeout_s: float = 10.0,
        nonfinite: NonFinitePolicy = "pass",
        expected_checksum: str | None = None,
        retry: RetryPolicy | Mapping[str, Any] | None = None,
        fallback: fallback_module.FallbackChoice = None,
        transport: str = "auto",
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if transport not in ("auto", "shm", "grpc"):
            raise ConfigurationError(f"transport must be 'auto', 'shm' or 'grpc', not {transport!r}")
        #: "auto": system shared memory to servers on this host (probed once), gRPC otherwise
        self.transport = transport
        if not urls:
            raise ConfigurationError("TritonModel needs at least one URL")
        self._refs: list[ModelRef] = [parse_model_url(u) for u in urls]
        first = self._refs[0]
        for ref, text in zip(self._refs, urls):
            if (ref.model, ref.version) != (first.model, first.version):
                raise ConfigurationError(
                    f"all URLs of one TritonModel must name the same model and version: "
                    f"{urls[0]!r} vs {text!r}")
        if len({ref.address for ref in self._refs}) != len(self._refs):
            raise ConfigurationError(f"a server is listed twice in {urls}")
        self._ref = first
        self.urls = urls
        self.url = urls[0]
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
        if ssl is False and any(ref.tls for ref in self._refs):
            raise ConfigurationError(f"{urls} ask for TLS (triton+grpcs) but ssl=False")
        url_tls = _configured_tls() if tls is None and any(r.tls for r in self._refs) else None
        self.tls = tls if tls is not None else (url_tls if first.tls else None)
        self._server_tls = [tls if tls is not None else (url_tls if ref.tls else None)
                            for ref in self._refs]
        if headers is None:
            headers = _configured_headers()
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.max_in_flight = max_in_flight
        self.max_request_bytes = max_request_bytes
        self.nonfinite = nonfinite
        self.expected_checksum = expected_checksum
        self.retry = RetryPolicy.coerce(retry)
        self.fallback = fallback_module.resolve_fallback(fallback)
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
        """The first server's ``host:port``."""
        return self._ref.address

    @property
    def addresses(self) -> list[str]:
        """Every server's ``host:port``, in the order given."""
        return [ref.address for ref in self._refs]

    def __repr__(self) -> str:
        extras = [f"timeout_s={self.timeout_s:g}", f"max_in_flight={self.max_in_flight}"]
        if self.headers:
            extras.append(f"headers={sorted(self.headers)}")
        if self.tls is not None and not self._ref.tls:
            extras.append("ssl=True")
        if self.fallback is not None:
            extras.append(f"fallback={self.fallback if isinstance(self.fallback, str) else 'custom'!r}")
        target = self.url if len(self.urls) == 1 else self.urls
        return f"TritonModel({target!r}, {', '.join(extras)})"

    # -- pickling: configuration only -------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("stats", "_stats_lock", "_runtime_lock", "_runtime", "_fallback_server"):
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
                router = get_router(
                    [(ref.address, tls) for ref, tls in zip(self._refs, self._server_tls)],
                    headers_fingerprint=header_fingerprint(self.headers) if self.headers else "",
                    metadata=metadata, policy=self.retry, connect_timeout_s=self.connect_timeout_s)
                runtime = _Runtime(pid=pid, router=router, metadata=metadata,
                                   window=_Window(self.max_in_flight, self._start_piece),
                                   version=self.version)
                self._runtime = runtime
            return runtime

    @property
    def info(self) -> ModelInfo:
        """What the servers declare for this model (fetched once per process, then cached)."""
        runtime = self._get_runtime()
        if runtime.info is None:
            with self._runtime_lock:
                if runtime.info is None:
                    try:
                        info, version = runtime.router.model_info(
                            self.model_name, self.version, timeout_s=self.timeout_s,
                            expected_checksum=self.expected_checksum)
                    except ServerUnavailableError as error:
                        info = _zoo_info(self.model_name) if self.fallback else None
                        if info is None:
                            raise
                        fallback_module.warn_fallback(self.model_name, 0, str(error))
                        version = self.version
                    runtime.version = version
                    runtime.info = info
        return runtime.info

    @property
    def served_version(self) -> str:
        """The version every request of this process names (resolved from the servers)."""
        self.info
        return self._get_runtime().version

    def close(self) -> None:
        """Forget this object's per-process state (pooled channels stay for other models)."""
        self._runtime = None

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
        now = time.monotonic()
        if not piece.first_try:
            piece.first_try, piece.deadline = now, now + self.retry.total_s
        endpoint = runtime.router.acquire(self.model_name, runtime.version, piece.avoid)
        if endpoint is None:
            runtime.window.release(pump=False)
            self._no_server(piece)
            return
        try:
            if self._uses_shared_memory(endpoint, runtime):
                future = self._send_through_shm(piece, endpoint, runtime)
                piece.future = future
                future.add_done_callback(lambda done, piece=piece: self._on_answer(piece, done))
                return
            if piece.request is None:
                tensors = piece_arrays(call.arrays, piece.start, piece.stop, piece.pad)
                piece.request = encode_request(self.model_name, runtime.version, tensors,
                                               request_id=f"{call.call_id}.{piece.index}")
                # from the arrays: reading raw_input_contents back would copy every byte again
                piece.bytes_sent = sum(array.nbytes for array in tensors.values())
            if piece.last_address and piece.last_address != endpoint.address:
                self._add_stats(failovers=1)
            piece.attempts += 1
            piece.endpoint, piece.last_address = endpoint, endpoint.address
            piece.sent_at = time.perf_counter()
            future = endpoint.connection.stub.ModelInfer.future(
                piece.request, timeout=self.timeout_s, metadata=runtime.metadata)
        except Exception as error:  # noqa: BLE001 - any failure to send fails the call
            runtime.router.release(endpoint, "other")
            runtime.window.release()
            self._fail(call, error)
            return
        piece.future = future
        future.add_done_callback(lambda done, piece=piece: self._on_answer(piece, done))

    def _uses_shared_memory(self, endpoint: Endpoint, runtime: "_Runtime") -> bool:
        if self.transport == "grpc":
            return False
        return select_transport(endpoint.address, self.transport, connection=endpoint.connection,
                                metadata=runtime.metadata) == "shm"

    def _send_through_shm(self, piece: _Piece, endpoint: Endpoint, runtime: "_Runtime") -> Any:
        """Send a piece through this process' shared-memory transport to ``endpoint``.

        The future behaves like gRPC's (its result is a ``ModelInferResponse``), so answers,
        errors, retries and failover take the same path as over gRPC.
        """
        call = piece.call
        if piece.tensors is None:
            piece.tensors = piece_arrays(call.arrays, piece.start, piece.stop, piece.pad)
            piece.bytes_sent = sum(array.nbytes for array in piece.tensors.values())
        if piece.last_address and piece.last_address != endpoint.address:
            self._add_stats(failovers=1)
        piece.attempts += 1
        piece.endpoint, piece.last_address = endpoint, endpoint.address
        piece.sent_at = time.perf_counter()
        transport = shared_transport(endpoint.address, "shm", metadata=runtime.metadata,
                                     headers_fingerprint=header_fingerprint(self.headers)
                                     if self.headers else "",
                                     connection=endpoint.connection)
        return transport.submit(self.model_name, runtime.version, piece.tensors, call.info.outputs,
                                timeout_s=self.timeout_s, metadata=runtime.metadata,
                                request_id=f"{call.call_id}.{piece.index}")

    def _on_answer(self, piece: _Piece, future: Any) -> None:
        call = piece.call
        runtime = call.runtime
        endpoint = piece.endpoint
        # the slot is freed before the caller is woken, so its next call starts in its own thread
        runtime.window.release(pump=False)
        try:
            if future.cancelled():
                runtime.router.release(endpoint, "other")
                return  # cancelled by _fail: the call already carries its error
            latency = time.perf_counter() - piece.sent_at
            error = future.exception()
            if error is None:
                runtime.router.release(endpoint, "ok")
                runtime.window.answered(overloaded=False)
                response = future.result()
                outputs = self._check_response(call.info, piece, response, endpoint.address)
                bytes_received = sum(array.nbytes for array in outputs.values())
                self._add_stats(requests=1, rows=piece.rows, bytes_sent=piece.bytes_sent,
                                bytes_received=bytes_received, latency_s=latency)
                self._record(piece, outputs)
                return
            detail = describe(error)
            outcome = server_outcome(error)
            runtime.router.release(endpoint, outcome, detail)
            piece.errors[endpoint.address] = detail
            self._add_stats(failed_requests=1)
            if not is_retryable(error):
                self._fail(call, as_sonic_error(error, model=self.model_name,
                                                version=runtime.version, address=endpoint.address))
                return
            if outcome == "busy":
                runtime.window.answered(overloaded=True)
                # overload is not the server failing: bounded by time, not by attempts
                piece.busy_attempts += 1
                piece.attempts -= 1
            self._retry(piece)
        except Exception as error:  # noqa: BLE001 - never lose an error in a gRPC thread
            self._fail(call, error)
        finally:
            runtime.window.pump()

    def _retry(self, piece: _Piece) -> None:
        """Send ``piece`` again after a backoff, elsewhere if possible; or give it up."""
        call = piece.call
        if piece.attempts >= self.retry.max_attempts or time.monotonic() >= piece.deadline:
            self._give_up(piece, f"{piece.attempts + piece.busy_attempts} attempt(s) failed")
            return
        piece.avoid = frozenset({piece.last_address})
        self._add_stats(retries=1)
        delay = self.retry.backoff_s(max(1, piece.attempts + piece.busy_attempts))
        logger.info("coffea-sonic: retrying %s rows %d-%d in %.2f s (attempt %d failed at %s: %s)",
                    self.model_name, piece.start, piece.stop, delay, piece.attempts,
                    piece.last_address, piece.errors.get(piece.last_address, "?"))
        call_later(delay, lambda: call.runtime.window.submit_front(piece))

    def _no_server(self, piece: _Piece) -> None:
        """No healthy server serves the model right now: fall back, wait for one, or give up."""
        router = piece.call.runtime.router
        version = piece.call.runtime.version
        if not router.could_serve(self.model_name, version):
            what = f"model {self.model_name!r}" + (f" version {version}" if version else "")
            self._fail(piece.call, ModelNotFoundError(
                f"no server serves {what} any more; {router.describe(self.model_name, version)}"))
            return
        if self.fallback is not None:
            self._run_fallback(piece, router.describe(self.model_name, piece.call.runtime.version))
            return
        left = piece.deadline - time.monotonic()
        if left <= 0:
            self._give_up(piece, "no healthy server left")
            return
        # wait for the health thread to re-admit a server (or for the deadline)
        wait = min(left, max(router.seconds_until_probe(), self.retry.backoff_s(1)) + 0.05)
        call_later(wait, lambda: piece.call.runtime.window.submit_front(piece))

    def _give_up(self, piece: _Piece, why: str) -> None:
        call = piece.call
        runtime = call.runtime
        if self.fallback is not None:
            self._run_fallback(piece, f"{why}; {runtime.router.describe(self.model_name, runtime.version)}")
            return
        elapsed = time.monotonic() - piece.first_try if piece.first_try else 0.0
        what = f"model {self.model_name!r}" + (f" version {runtime.version}" if runtime.version else "")
        errors = "; ".join(f"{address}: {error}" for address, error in piece.errors.items())
        self._fail(call, ServerUnavailableError(
            f"{what}: no server could serve rows {piece.start}-{piece.stop} of a {call.rows}-row "
            f"call ({why}, {elapsed:.1f} s); "
            f"{runtime.router.describe(self.model_name, runtime.version)}"
            + (f"; last errors: {errors}" if errors else "")
            + ". Start or fix a server, or enable the in-process fallback with fallback='cpu' "
              "(or COFFEA_SONIC_FALLBACK=cpu)"))

    def _run_fallback(self, piece: _Piece, reason: str) -> None:
        call = piece.call
        if call.error is not None:
            return
        choice = self.fallback
        fallback_module.warn_fallback(self.model_name, piece.rows, reason)

        def work() -> None:
            try:
                engine = fallback_module.fallback_engine(choice, self.model_name)
                produced = engine(piece_arrays(call.arrays, piece.start, piece.stop, piece.pad))
                outputs = self._check_outputs(call.info, piece, produced, "fallback engine")
                self._add_stats(fallback_calls=1, fallback_rows=piece.rows, rows=piece.rows)
                self._record(piece, outputs)
            except Exception as error:  # noqa: BLE001 - the call must learn about it
                self._fail(call, error)

        fallback_module.submit(work)

    def _record(self, piece: _Piece, outputs: dict[str, np.ndarray]) -> None:
        call = piece.call
        piece.request = None  # the bytes are no longer needed
        with call.lock:
            if call.results[piece.index] is not None:  # a late duplicate answer: keep the first
                return
            call.results[piece.index] = outputs
            call.remaining -= 1
            finished = call.remaining == 0 and call.error is None
        if finished:
            call.done.set()

    def _check_response(self, info: ModelInfo, piece: _Piece, response: Any,
                        address: str) -> dict[str, np.ndarray]:
        version = piece.call.runtime.version
        if version and response.model_version and response.model_version != version:
            raise InferenceError(
                f"model {self.model_name!r}: requested version {version} but {address} answered "
                f"with version {response.model_version}")
        return self._check_outputs(info, piece, decode_response(response), address)

    def _check_outputs(self, info: ModelInfo, piece: _Piece, outputs: Mapping[str, Any],
                       source: str) -> dict[str, np.ndarray]:
        missing = [name for name in info.output_names if name not in outputs]
        if missing:
            raise InferenceError(
                f"model {self.model_name!r} at {source}: answer lacks outputs {missing} "
                f"(got {sorted(outputs)})")
        sent_rows = piece.rows + piece.pad
        checked = {}
        for tensor in info.outputs:
            array = np.asarray(outputs[tensor.name])
            if array.ndim == 0 or array.shape[0] != sent_rows:
                raise InferenceError(
                    f"model {self.model_name!r} at {source}: output {tensor.name!r} has shape "
                    f"{list(array.shape)} for a request of {sent_rows} rows; refusing misaligned "
                    "outputs")
            if array.dtype != tensor.dtype:
                if not np.can_cast(array.dtype, tensor.dtype, casting="safe"):
                    raise InferenceError(
                        f"model {self.model_name!r} output {tensor.name!r}: {source} gave "
                        f"{array.dtype}, the model declares {tensor.dtype}")
                array = array.astype(tensor.dtype)
            checked[tensor.name] = array
        return checked

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
            if len(outputs[name]) != call.rows:  # a lost piece: never hand it out
                raise InferenceError(
                    f"model {self.model_name!r}: assembled {len(outputs[name])} rows of output "
                    f"{name!r} for {call.rows} input rows")
        call.results = []  # the response bytes are no longer needed
        call.arrays = {}
        return outputs

    def _add_stats(self, **counts: float) -> None:
        with self._stats_lock:
            for name, value in counts.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)

    # -- server-side statistics -------------------------------------------------------------------

    def server_statistics(self) -> ServerStatistics:
        """Triton's cumulative statistics for this model, summed over the reachable servers."""
        import grpc
        from tritonclient.grpc import service_pb2

        runtime = self._get_runtime()
        total = ServerStatistics()
        failures = []
        for endpoint in runtime.router.endpoints:
            try:
                response = endpoint.connection.stub.ModelStatistics(
                    service_pb2.ModelStatisticsRequest(name=self.model_name, version=self.version),
                    timeout=min(self.timeout_s, self.connect_timeout_s), metadata=runtime.metadata)
            except grpc.RpcError as error:
                failures.append(as_sonic_error(error, model=self.model_name,
                                               version=self.version, address=endpoint.address))
                continue
            total += ServerStatistics.from_model_stats(response.model_stats)
        if len(failures) == len(runtime.router.endpoints):
            raise failures[0]
        return total

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
