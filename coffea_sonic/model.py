"""``TritonModel``: a picklable client of one model served by one or several Triton servers.

Drop-in for ``coffea.ml_tools.triton_wrapper`` URLs (``triton+grpc://host:port/model[/version]``,
``triton+grpcs://`` for TLS, ``triton+http[s]://`` for Triton's HTTP API), but a call is validated on the client, split by ``max_batch_size``
and by bytes, sent as concurrent requests through a bounded in-flight window, and reassembled once
in input order. ``infer_async`` sends at once and returns a handle, so CPU work overlaps the
request (SONIC's acquire/produce).

>>> from coffea_sonic.model import TritonModel
>>> model = TritonModel("triton+grpc://127.0.0.1:8001/jet_tagger/1", timeout_s=30)
>>> model
TritonModel('triton+grpc://127.0.0.1:8001/jet_tagger/1', timeout_s=30)
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
  :mod:`coffea_sonic.fallback`).
* Versions: an unpinned URL is resolved once per process to the highest version served, and every
  request names it; a pinned version must be the one that answers.
* Transports (:mod:`coffea_sonic.transport`): ``"auto"`` sends tensors through shared memory to a
  server proven to be on this host (not behind a balancer), over the URL's protocol otherwise;
  request size and in-flight window default per transport (:data:`TRANSPORT_DEFAULTS`).
* Connection: never pickled; one channel (and slot pool) per process and server, made after any
  fork.
* Secrets: header values are :class:`~coffea_sonic.core.secrets.Secret` (redacted in reprs, never
  pickled in clear; use ``Secret.bearer_from_env("NAME")`` for Dask workers); so is the key of
  servers that restrict protocol groups (``protocol_key``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from . import fallback as fallback_module
from . import ragged as ragged_module
from .cache import CacheChoice, resolve_cache
from .cache.lookup import cacheable, infer_cached
from .calls import Call, InferenceHandle, Piece, Window
from .core.endpoint import (ModelRef, ServerSettings, configured_headers, configured_protocol_key,
                            configured_tls, parse_model_url)
from .core.secrets import Secret, normalize_headers
from .core.tensors import ModelInfo
from .core.tls import TlsOptions
from .errors import (ConfigurationError, InferenceError, ModelNotFoundError, ServerUnavailableError,
                     SonicError)
from .routing import RetryPolicy, Router, call_later, get_router
from .stats import InferenceStats, ServerStatistics
from .transport.base import InferAnswer, InferRequest
from .transport.errors import TransportError, to_sonic_error
from .validation import (GRPC_MESSAGE_LIMIT, NonFinitePolicy, empty_outputs, piece_arrays,
                         plan_pieces, validate_inputs)

__all__ = ["TRANSPORT_DEFAULTS", "InferenceHandle", "ServerDelta", "TritonModel"]

logger = logging.getLogger(__name__)

#: Default (max request bytes, requests in flight) per transport, used unless given.
#: gRPC and HTTP: Python gRPC moves a 38 MB request at 0.25 GB/s but 2.4 MB ones at 1.2 GB/s
#: (H100 machine, benchmarks/RESULTS.md), and several requests in flight overlap the copies of
#: one with the server's work on another. Shared memory has no message cost: bigger requests
#: mean fewer, larger batches on the server: on an H100 (16 cores, emtrk_cnn, 2048-row chunks)
#: 9 MiB pieces (equal-sized) with 2 in flight kept the GPU 85-95 % busy with 8 client processes
#: (1.04-1.12x in-process), where 4 MiB x 4 reached 0.69x (benchmarks/gpu/results-defaults).
#: CUDA shared memory (auto's choice for GPU models where the client has CUDA): the whole 2048-row
#: chunk (18.9 MB) in one request beat 2 or 4 pieces in flight from one process (0.51-0.53x vs
#: 0.39-0.49x in-process, H200) and reached 1.10-1.12x with 8 processes (GPU 97 %).
TRANSPORT_DEFAULTS: dict[str, tuple[int, int]] = {
    "grpc": (4 * 2**20, 4),
    "http": (4 * 2**20, 4),
    "shm": (9 * 2**20, 2),
    "cuda": (32 * 2**20, 2),
    "memory": (4 * 2**20, 4),
}
#: Kept for callers of the first releases: gRPC's default request cap.
DEFAULT_MAX_REQUEST_BYTES = TRANSPORT_DEFAULTS["grpc"][0]

_call_ids = itertools.count(1)
_TRANSPORT_NAMES = ("auto", "grpc", "shm", "cuda", "http")


@dataclass(eq=False)
class _Runtime:
    """What a TritonModel holds in one process (never pickled)."""

    pid: int
    router: Router
    window: Window | None = None
    #: the transport kind whose defaults size requests and the window
    kind: str = ""
    info: ModelInfo | None = None
    #: the version every request names ("" only when no server could be asked)
    version: str = ""


class TritonModel:
    """Client of one Triton model: validated, split, pipelined inference on numpy dicts.

    Parameters
    ----------
    url:
        ``triton+grpc://host:port/model[/version]`` (``triton+grpcs://`` for TLS,
        ``triton+http[s]://`` for the HTTP API), or a list of such URLs of the same model on
        several servers. No version means the latest served.
    timeout_s:
        Deadline of each request (a slower server is given up on and the request retried
        elsewhere). ``connect_timeout_s``: how long to wait for a server to answer at all.
    transport:
        ``"auto"`` (shared memory to a server proven to be on this host, the URL's protocol
        otherwise; for a model the server runs on a GPU, CUDA shared memory where this process
        has torch with CUDA and the server maps its GPU memory), ``"grpc"``, ``"shm"`` (demand
        system shared memory), ``"cuda"`` (demand CUDA shared memory), ``"http"`` (with
        ``triton+http://`` URLs), or a factory ``f(ServerSettings) -> Transport``. None: the
        ``transport`` setting (``COFFEA_SONIC_TRANSPORT``, Dask config, facility file), default
        ``"auto"``.
    max_in_flight, max_request_bytes:
        Requests of this model in flight at once (per process and model object), and the cap on
        one request's tensor bytes (calls are split by rows to stay under it). None: the
        transport's default (:data:`TRANSPORT_DEFAULTS`).
    ssl:
        ``True`` (system CA roots), a mapping or :class:`~coffea_sonic.core.tls.TlsOptions`
        (CA bundle, client certificate and key for mutual TLS, server-name override). None:
        ``triton+grpcs://`` URLs use the settings ``ca_file``, ``cert_file``, ``key_file``,
        ``server_name`` (``COFFEA_SONIC_CA_FILE``, ...) or the system roots.
    headers:
        Sent with every request, e.g. ``{"authorization": Secret.bearer_from_env("TOKEN")}``.
        Sensitive plain-string values (authorization, token, key, ...) are wrapped in
        :class:`~coffea_sonic.core.secrets.Secret` automatically. None: a bearer token from the
        settings ``token_env`` (``COFFEA_SONIC_TOKEN_ENV=NAME``) or ``token_file``, if set.
    protocol_key:
        ``("KEY", Secret.from_env("NAME"))`` for servers that restrict protocol groups
        (``--grpc-restricted-protocol=...:KEY=VALUE``; PyTriton: ``triton-access-token``).
        Not needed for inference (it stays open); it unlocks the repository index, shared memory
        and statistics. None: the settings ``protocol_key_name`` + ``protocol_key_env``.
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
        :mod:`coffea_sonic.fallback`.
    priority:
        Priority level of every request for Triton's dynamic batcher (1 is served first; the
        model must be configured with ``priority_levels``, see
        :func:`coffea_sonic.server.repository.model_config`). None: the model's default level.
    cache:
        A directory (shareable by every worker) that keeps outputs across runs, keyed by model,
        served version, config digest and input bytes (:mod:`coffea_sonic.cache`); False: off;
        None: the ``inference_cache`` setting (``COFFEA_SONIC_INFERENCE_CACHE``), off if unset.
    cache_offline:
        With ``cache`` and a pinned version: when no server answers the model's metadata, use
        the signature last served through the cache, so cached rows are answered offline.

    >>> TritonModel("triton+grpc://127.0.0.1:8001/jet_tagger").version
    ''
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        timeout_s: float = 60.0,
        max_in_flight: int | None = None,
        ssl: TlsOptions | Mapping[str, Any] | bool | None = None,
        headers: Mapping[str, str | Secret] | None = None,
        max_request_bytes: int | None = None,
        connect_timeout_s: float = 10.0,
        nonfinite: NonFinitePolicy = "pass",
        expected_checksum: str | None = None,
        retry: RetryPolicy | Mapping[str, Any] | None = None,
        fallback: fallback_module.FallbackChoice = None,
        transport: str | Callable[[ServerSettings], Any] | None = None,
        protocol_key: Any = None,
        priority: int | None = None,
        cache: CacheChoice = None,
        cache_offline: bool = False,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if transport is None:
            from . import config

            transport = str(config.setting("transport", "auto")).strip().lower()
        if not callable(transport) and transport not in _TRANSPORT_NAMES:
            raise ConfigurationError(
                f"transport must be one of {', '.join(map(repr, _TRANSPORT_NAMES))} or a factory "
                f"f(ServerSettings) -> Transport, not {transport!r}")
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
        if len({(ref.protocol, ref.address) for ref in self._refs}) != len(self._refs):
            raise ConfigurationError(f"a server is listed twice in {urls}")
        self._ref = first
        self.urls = urls
        self.url = urls[0]
        if timeout_s is None or not timeout_s > 0:
            raise ConfigurationError(f"timeout_s must be > 0 seconds, not {timeout_s!r}")
        if connect_timeout_s is None or not connect_timeout_s > 0:
            raise ConfigurationError(f"connect_timeout_s must be > 0, not {connect_timeout_s!r}")
        if max_in_flight is not None and (not isinstance(max_in_flight, int) or max_in_flight < 1):
            raise ConfigurationError(f"max_in_flight must be an int >= 1, not {max_in_flight!r}")
        if max_request_bytes is not None and (not isinstance(max_request_bytes, int) or not (
                1 <= max_request_bytes <= GRPC_MESSAGE_LIMIT - (1 << 20))):
            raise ConfigurationError(
                "max_request_bytes must be an int between 1 and gRPC's 2 GiB message limit "
                f"(less 1 MiB framing), not {max_request_bytes!r}")
        if nonfinite not in ("pass", "raise"):
            raise ConfigurationError(f"nonfinite must be 'pass' or 'raise', not {nonfinite!r}")
        tls = TlsOptions.coerce(ssl)
        if ssl is False and any(ref.tls for ref in self._refs):
            raise ConfigurationError(f"{urls} ask for TLS (triton+grpcs) but ssl=False")
        url_tls = configured_tls() if tls is None and any(r.tls for r in self._refs) else None
        self.tls = tls if tls is not None else (url_tls if first.tls else None)
        if headers is None:
            headers = configured_headers()
        self.headers = normalize_headers(headers)
        if protocol_key is None:
            protocol_key = configured_protocol_key()
        #: how each server is reached (the one settings type of TritonModel, check, monitor)
        self.servers: list[ServerSettings] = [
            ServerSettings.build(ref.address, protocol=ref.protocol,
                                 tls=tls if tls is not None else (url_tls if ref.tls else None),
                                 headers=self.headers, protocol_key=protocol_key)
            for ref in self._refs]
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.max_in_flight = max_in_flight
        self.max_request_bytes = max_request_bytes
        self.nonfinite = nonfinite
        self.expected_checksum = expected_checksum
        self.retry = RetryPolicy.coerce(retry)
        self.fallback = fallback_module.resolve_fallback(fallback)
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                     or priority < 1):
            raise ConfigurationError(f"priority must be an int >= 1 (1 is served first) or None, "
                                     f"not {priority!r}")
        self.priority = priority
        #: the persistent inference cache (:mod:`coffea_sonic.cache`), None when off
        self.cache = resolve_cache(cache)
        self.cache_offline = bool(cache_offline)
        if cache_offline and (self.cache is None or not self.version):
            raise ConfigurationError(
                "cache_offline=True answers from the cache while no server is up, so it needs "
                "cache=DIR and a URL that pins the version (.../model/VERSION)")
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
        extras = [f"timeout_s={self.timeout_s:g}"]
        if self.max_in_flight is not None:
            extras.append(f"max_in_flight={self.max_in_flight}")
        if self.transport != "auto":
            extras.append(f"transport={self.transport if isinstance(self.transport, str) else 'custom'!r}")
        if self.headers:
            extras.append(f"headers={sorted(self.headers)}")
        if self.servers[0].protocol_key is not None:
            extras.append(f"protocol_key={self.servers[0].protocol_key[0]!r}")
        if self.tls is not None and not self._ref.tls:
            extras.append("ssl=True")
        if self.priority is not None:
            extras.append(f"priority={self.priority}")
        if self.fallback is not None:
            extras.append(f"fallback={self.fallback if isinstance(self.fallback, str) else 'custom'!r}")
        if self.cache is not None:
            extras.append(f"cache={str(self.cache.root)!r}")
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
                router = get_router(self.servers, policy=self.retry,
                                    connect_timeout_s=self.connect_timeout_s,
                                    transport=self.transport)
                runtime = _Runtime(pid=pid, router=router, version=self.version)
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
                        info = fallback_module.declared_info(self.fallback, self.model_name)
                        if info is None and self.cache_offline:
                            info = self.cache.offline_info(self.model_name, self.version)
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

    @property
    def transport_kind(self) -> str:
        """The transport this process' requests to the first healthy server use now
        (``"shm"``, ``"cuda"``, ``"grpc"``, ``"http"``, ...; after a region error, the plain one)."""
        runtime = self._get_runtime()
        kind = self._window(runtime)[1]  # raises where the transport asked for cannot be had
        try:
            self.info  # whether the model runs on a GPU decides between system and CUDA memory
        except SonicError:
            return kind  # e.g. the server is down: its requests will say so
        endpoint = next((e for e in runtime.router.endpoints if e.healthy), None)
        if endpoint is not None and endpoint.data is not None:
            return runtime.router.data_transport(endpoint, self._on_gpu()).name
        return kind

    def _on_gpu(self) -> bool:
        """Whether the server runs this model on its GPU 0 only (from its config; False if
        unknown): where CUDA shared memory may carry its tensors."""
        info = self._get_runtime().info
        return bool(info is not None and info.on_gpu_zero)

    def _kind(self, runtime: _Runtime) -> str:
        """The transport kind of requests to the first usable server ("grpc" if none is)."""
        endpoint = next((e for e in runtime.router.endpoints if e.healthy), None)
        if endpoint is None:
            return "grpc"
        try:
            return runtime.router.data_transport(endpoint, self._on_gpu()).name
        except TransportError:
            return "grpc"  # decided again per request; the request reports the error

    def _window(self, runtime: _Runtime) -> tuple[Window, str]:
        """The runtime's in-flight window, sized by the transport of the first usable server,
        and that transport's kind (whose defaults also cap a request's bytes)."""
        if runtime.window is None:
            with self._runtime_lock:
                if runtime.window is None:
                    kind = self._kind(runtime)
                    limit = self.max_in_flight or TRANSPORT_DEFAULTS.get(kind, (0, 4))[1]
                    runtime.kind = kind
                    runtime.window = Window(limit, self._start_piece)
        if runtime.kind == "shm" and self._on_gpu():
            runtime.kind = self._kind(runtime)  # known only once the model's info is
        return runtime.window, runtime.kind

    def close(self) -> None:
        """Forget this object's per-process state (pooled transports stay for other models)."""
        self._runtime = None

    # -- inference ----------------------------------------------------------------------------------

    def __call__(self, inputs: Mapping[str, Any], *, counts: Any = None) -> dict[str, np.ndarray]:
        """Run the model on ``{input name: array}``; returns ``{output name: array}``.

        ``counts`` (rows per event) makes it a ragged call (:mod:`coffea_sonic.ragged`): the
        inputs are the events' rows, unpadded; per-object outputs come back with one row per
        input row, per-event outputs with one row per event. A call that fits in one request
        goes over gRPC as a blocking call in this thread (no hand-off to gRPC's threads and back).
        """
        return self._infer(inputs, counts, caller_waits=True).result()

    def infer_async(self, inputs: Mapping[str, Any], *, counts: Any = None) -> InferenceHandle:
        """Validate and send now; the handle's ``result()`` gives what ``__call__`` would."""
        return self._infer(inputs, counts, caller_waits=False)

    def _infer(self, inputs: Mapping[str, Any], counts: Any, caller_waits: bool) -> InferenceHandle:
        """``infer_async``; ``caller_waits``: the calling thread only waits for the answer, so a
        one-request call may be sent and answered in it (no hand-off to other threads)."""
        info = self.info
        runtime = self._get_runtime()
        ragged = None
        if counts is None:
            ragged_module.check_plain_call(info, inputs)
            arrays, rows = validate_inputs(info, inputs, self.nonfinite)
        else:  # rows of the call are events; pieces are groups of whole events
            ragged = ragged_module.RaggedCall.build(info, inputs, counts, self.nonfinite)
            arrays, rows = ragged.arrays, ragged.events
        self._add_stats(calls=1)
        if self.cache is not None and rows and runtime.version and cacheable(info, arrays):
            return infer_cached(
                self.cache, info, runtime.version, arrays, rows,
                None if ragged is None else ragged.counts,
                lambda sub, sub_rows: self._submit(info, runtime, sub, sub_rows, ragged,
                                                   caller_waits), self._add_stats)
        return self._submit(info, runtime, arrays, rows, ragged, caller_waits)

    def _submit(self, info: ModelInfo, runtime: _Runtime, arrays: dict[str, np.ndarray],
                rows: int, ragged: Any, caller_waits: bool) -> InferenceHandle:
        """Split validated ``arrays`` into requests and send them; the call's handle."""
        call = Call(call_id=next(_call_ids), arrays=arrays, rows=rows, runtime=runtime, info=info,
                    ragged=ragged, caller=threading.get_ident() if caller_waits else None)
        if rows == 0:
            call.outputs = empty_outputs(info) if ragged is None else ragged.empty_outputs()
            call.done.set()
            return InferenceHandle(self, call)
        window, kind = self._window(runtime)
        cap = self.max_request_bytes or TRANSPORT_DEFAULTS.get(kind, DEFAULT_MAX_REQUEST_BYTES)[0]
        plan = plan_pieces(info, arrays, rows, cap) if ragged is None else ragged.plan(cap)
        call.pieces = [Piece(call, index, start, stop, pad)
                       for index, (start, stop, pad) in enumerate(plan)]
        call.results = [None] * len(call.pieces)
        call.remaining = len(call.pieces)
        call.out = _preallocate(info, rows) if ragged is None else None
        window.submit(call.pieces)
        return InferenceHandle(self, call)

    def _start_piece(self, piece: Piece) -> None:
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
            transport = runtime.router.data_transport(endpoint, call.info.on_gpu_zero)
            if piece.tensors is None:
                piece.tensors = _piece_tensors(piece)
                piece.bytes_sent = sum(array.nbytes for array in piece.tensors.values())
            ragged = call.ragged  # one batch item per group; outputs shaped by its events
            request = InferRequest(
                self.model_name, runtime.version, piece.tensors,
                call.info.outputs if ragged is None else ragged.request_outputs(piece.start,
                                                                                piece.stop),
                rows=piece.rows + piece.pad if call.info.batching and ragged is None else None,
                timeout_s=self.timeout_s, request_id=f"{call.call_id}.{piece.index}",
                out=({name: array[piece.start:piece.stop] for name, array in call.out.items()}
                     if call.out is not None else None), priority=self.priority or 0,
                # started by the thread of a __call__ that only waits for this one request
                caller_waits=len(call.pieces) == 1 and call.caller == threading.get_ident())
            if piece.last_address and piece.last_address != endpoint.address:
                self._add_stats(failovers=1)
            piece.attempts += 1
            piece.endpoint, piece.last_address, piece.transport = endpoint, endpoint.address, transport
            piece.sent_at = time.perf_counter()
            future = transport.submit(request)
        except Exception as error:  # noqa: BLE001 - any failure to send fails the call
            runtime.router.release(endpoint, "other")
            runtime.window.release()
            self._fail(call, error)
            return
        piece.future = future
        future.add_done_callback(lambda done, piece=piece: self._on_answer(piece, done))

    def _on_answer(self, piece: Piece, future: Any) -> None:
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
                answer: InferAnswer = future.result()
                outputs = self._check_answer(call.info, piece, answer, endpoint.address)
                self._add_stats(requests=1, rows=piece.rows, bytes_sent=piece.bytes_sent,
                                bytes_received=answer.nbytes, latency_s=latency)
                self._record(piece, outputs)
                return
            if not isinstance(error, TransportError):  # e.g. a malformed answer: never retried
                runtime.router.release(endpoint, "other")
                self._fail(call, error)
                return
            if error.kind == "shm_region" and piece.transport.name in ("shm", "cuda"):
                # the server does not know our region (a balancer sent the request elsewhere,
                # or it restarted): this server gets plain requests from now on; not a failure
                runtime.router.release(endpoint, "other")
                runtime.router.disable_shm(endpoint, error.describe())
                piece.attempts -= 1
                runtime.window.submit_front(piece)
                return
            detail = error.describe()
            runtime.router.release(endpoint, error.outcome, detail)
            piece.errors[endpoint.address] = detail
            self._add_stats(failed_requests=1)
            if not error.retryable:
                self._fail(call, to_sonic_error(error, model=self.model_name,
                                                version=runtime.version, address=endpoint.address))
                return
            if error.outcome == "busy":
                runtime.window.answered(overloaded=True)
                # overload is not the server failing: bounded by time, not by attempts
                piece.busy_attempts += 1
                piece.attempts -= 1
            self._retry(piece)
        except Exception as error:  # noqa: BLE001 - never lose an error in a transport thread
            self._fail(call, error)
        finally:
            runtime.window.pump()

    def _retry(self, piece: Piece) -> None:
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

    def _no_server(self, piece: Piece) -> None:
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

    def _give_up(self, piece: Piece, why: str) -> None:
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

    def _run_fallback(self, piece: Piece, reason: str) -> None:
        call = piece.call
        if call.error is not None:
            return
        choice = self.fallback
        call.fallback = True  # its outputs are not stored in the inference cache
        fallback_module.warn_fallback(self.model_name, piece.rows, reason)

        def work() -> None:
            try:
                engine = fallback_module.fallback_engine(choice, self.model_name)
                produced = engine(_piece_tensors(piece))
                outputs = self._check_outputs(call.info, piece, produced, "fallback engine")
                self._add_stats(fallback_calls=1, fallback_rows=piece.rows, rows=piece.rows)
                self._record(piece, outputs)
            except Exception as error:  # noqa: BLE001 - the call must learn about it
                self._fail(call, error)

        fallback_module.submit(work)

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

    def _check_answer(self, info: ModelInfo, piece: Piece, answer: InferAnswer,
                      address: str) -> dict[str, np.ndarray]:
        version = piece.call.runtime.version
        if version and answer.model_version and answer.model_version != version:
            raise InferenceError(
                f"model {self.model_name!r}: requested version {version} but {address} answered "
                f"with version {answer.model_version}")
        return self._check_outputs(info, piece, answer.outputs, address, answer.delivered)

    def _check_outputs(self, info: ModelInfo, piece: Piece, outputs: Mapping[str, Any],
                       source: str, delivered: frozenset[str] = frozenset()
                       ) -> dict[str, np.ndarray]:
        if piece.call.ragged is not None:
            return piece.call.ragged.check(piece.start, piece.stop, outputs, source)
        missing = [name for name in info.output_names if name not in outputs]
        if missing:
            raise InferenceError(
                f"model {self.model_name!r} at {source}: answer lacks outputs {missing} "
                f"(got {sorted(outputs)})")
        sent_rows = piece.rows + piece.pad
        checked = {}
        for tensor in info.outputs:
            if tensor.name in delivered:  # written into the call's rows, shape checked on arrival
                checked[tensor.name] = outputs[tensor.name]
                continue
            array = np.asarray(outputs[tensor.name])
            if info.batching and (array.ndim == 0 or array.shape[0] != sent_rows):
                raise InferenceError(
                    f"model {self.model_name!r} at {source}: output {tensor.name!r} has shape "
                    f"{list(array.shape)} for a request of {sent_rows} rows; refusing misaligned "
                    "outputs")
            expected = tuple(tensor.dims)
            got = array.shape[1:] if info.batching else array.shape
            if len(got) != len(expected) or any(d >= 0 and d != g for d, g in zip(expected, got)):
                raise InferenceError(
                    f"model {self.model_name!r} at {source}: output {tensor.name!r} has per-row "
                    f"shape {list(got)}, the model declares {list(expected)}")
            if array.dtype != tensor.dtype:
                if not np.can_cast(array.dtype, tensor.dtype, casting="safe"):
                    raise InferenceError(
                        f"model {self.model_name!r} output {tensor.name!r}: {source} gave "
                        f"{array.dtype}, the model declares {tensor.dtype}")
                array = array.astype(tensor.dtype)
            checked[tensor.name] = array
        return checked

    def _fail(self, call: Call, error: BaseException) -> None:
        with call.lock:
            if call.error is not None or call.done.is_set():
                return
            call.error = error
        for piece in call.pieces:
            future = piece.future
            if future is not None and not future.done():
                future.cancel()
        call.done.set()

    def _assemble(self, call: Call) -> dict[str, np.ndarray]:
        """The call's outputs in input order: the preallocated arrays every piece wrote into,
        or (outputs of variable shape) the pieces' outputs concatenated once."""
        if call.ragged is not None:  # per-object and per-event outputs, checked there
            outputs = call.ragged.assemble([(p.start, p.stop) for p in call.pieces], call.results)
            call.results, call.arrays = [], {}
            return outputs
        if call.out is not None:
            outputs = call.out
        else:
            outputs = {}
            for name in call.info.output_names:
                parts = [result[name][: piece.rows]
                         for piece, result in zip(call.pieces, call.results)]
                outputs[name] = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
        for name, array in outputs.items():
            if len(array) != call.rows or any(result is None for result in call.results):
                raise InferenceError(  # a lost piece: never hand it out
                    f"model {self.model_name!r}: assembled {len(array)} rows of output "
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
        """Triton's cumulative statistics for this model, summed over the reachable servers.

        Servers that restrict their statistics are skipped (``protocol_key`` unlocks them);
        raises if no server gives any.
        """
        runtime = self._get_runtime()
        total = ServerStatistics()
        failures: list[BaseException] = []
        for endpoint in runtime.router.endpoints:
            try:
                total += runtime.router.control(endpoint).statistics(
                    self.model_name, self.version, min(self.timeout_s, self.connect_timeout_s))
            except TransportError as error:
                failures.append(to_sonic_error(error, model=self.model_name,
                                               version=self.version, address=endpoint.address))
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


def _piece_tensors(piece: Piece) -> dict[str, np.ndarray]:
    """The input tensors of ``piece``: its rows (plus padding), or its group of ragged events."""
    call = piece.call
    if call.ragged is not None:
        return call.ragged.tensors(piece.start, piece.stop)
    return piece_arrays(call.arrays, piece.start, piece.stop, piece.pad)


def _preallocate(info: ModelInfo, rows: int) -> dict[str, np.ndarray] | None:
    """The call's output arrays when every output's per-row shape is known, else None."""
    if not info.batching:
        return None
    if any(d < 0 for t in info.outputs for d in t.dims) or any(
            t.dtype == object for t in info.outputs):
        return None
    return {t.name: np.empty((rows, *t.dims), dtype=t.dtype) for t in info.outputs}


@dataclass
class ServerDelta:
    """Holder filled by :meth:`TritonModel.measure_server` when its block ends."""

    before: ServerStatistics
    delta: ServerStatistics = field(default_factory=ServerStatistics)
