"""``TritonModel``: a picklable client of one model served by one or several Triton servers.

How it works, with examples, and where each guarantee is described: docs/internals/client.md.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from . import fallback as fallback_module
from .cache import CacheChoice, resolve_cache
from .cache.lookup import cacheable, infer_cached
from .calls import InferenceHandle
from .classification import ClassificationChoice, check_classification, classified
from . import model_options as options
from .core.endpoint import ModelRef, ServerSettings, configured_headers, configured_protocol_key
from .core.secrets import Secret, normalize_headers
from .core.tensors import ModelInfo
from .core.tls import TlsOptions
from .dispatch import CallHooks, CallRunner
from .errors import ConfigurationError, ServerUnavailableError, SonicError
from .retry import RetryPolicy
from .routing import get_router
from .shadow import ShadowAction, ShadowHook, resolve_shadow
from .stats import InferenceStats, ServerStatistics, counted_since
from .tracing import TraceHook
from .transport.errors import TransportError, to_sonic_error
from .transport.kinds import KINDS
from .validation import NonFinitePolicy

__all__ = ["TRANSPORT_DEFAULTS", "InferenceHandle", "ServerDelta", "TritonModel"]

logger = logging.getLogger(__name__)

#: Default (max request bytes, requests in flight) per transport, used unless given (the table
#: and why: :mod:`coffea_sonic.transport.kinds`).
TRANSPORT_DEFAULTS: dict[str, tuple[int, int]] = {
    name: (kind.max_request_bytes, kind.max_in_flight) for name, kind in KINDS.items()}
#: gRPC's default request cap, for callers of the first releases.
DEFAULT_MAX_REQUEST_BYTES = TRANSPORT_DEFAULTS["grpc"][0]


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
        elsewhere). ``connect_timeout_s``: how long to wait for a server to answer at all (None:
        the ``connect_timeout_s`` setting, default 10 s); one that does not is quarantined.
    transport:
        ``"auto"``, ``"grpc"``, ``"shm"``, ``"cuda"``, ``"http"`` (with ``triton+http://`` URLs),
        or a factory ``f(ServerSettings) -> Transport`` (what each means: docs/user/processor.md,
        "How tensors travel"). None: the ``transport`` setting, default ``"auto"``.
    max_in_flight, max_request_bytes:
        Requests of this model in flight at once (per process and model object), and the cap on
        one request's tensor bytes (calls are split by rows to stay under it). None: the
        transport's default (:data:`TRANSPORT_DEFAULTS`).
    ssl:
        ``True`` (system CA roots), a mapping or :class:`~coffea_sonic.core.tls.TlsOptions`
        (CA bundle, client certificate and key, server-name override). None: the settings
        ``ca_file``, ``cert_file``, ``key_file``, ``server_name`` for ``triton+grpcs://`` URLs.
    headers:
        Sent with every request, e.g. ``{"authorization": Secret.bearer_from_env("TOKEN")}``
        (sensitive plain strings are wrapped in :class:`~coffea_sonic.core.secrets.Secret`).
        None: a bearer token from the settings ``token_env`` or ``token_file``, if set.
    protocol_key:
        ``("KEY", Secret.from_env("NAME"))`` for servers that restrict protocol groups
        (docs/user/processor.md, "Servers we did not write"). None: the settings
        ``protocol_key_name`` + ``protocol_key_env``.
    nonfinite:
        ``"warn"`` sends NaN/inf as given and warns once per model and tensor; ``"pass"`` sends
        them without looking; ``"raise"`` rejects them. None: the ``nonfinite`` setting (default
        ``"warn"``).
    expected_checksum:
        If set, every server's checksum of the model (``model.info.checksum``: its signature
        and the served config's parts that change answers) must equal it.
    retry:
        :class:`~coffea_sonic.routing.RetryPolicy` or a mapping of its fields (attempts, total
        time, backoff, quarantine).
    fallback:
        ``"off"``, ``"cpu"``, ``"local"`` or a factory ``f(model) -> engine``
        (docs/internals/routing.md); None: the ``fallback`` setting (default off).
    priority:
        Priority level of every request for Triton's dynamic batcher (1 is served first; the
        model needs ``priority_levels``, docs/internals/repositories.md). None: the model's
        default level.
    cache:
        A directory (shareable by every worker) that keeps outputs across runs
        (docs/internals/caches.md); False: off; None: the ``inference_cache`` setting.
    cache_offline:
        With ``cache`` and a pinned version: when no server answers the model's metadata, use
        the signature last served through the cache, so cached rows are answered offline.
    shadow, shadow_tolerance, shadow_action:
        Recompute about this fraction of served rows in-process and compare; above the tolerance
        ``"raise"`` on the next call or ``"quarantine"`` the server (docs/internals/shadow.md).
        None: the setting ``shadow`` (default 0, off).
    classification:
        K (every output) or ``{output: K}``: the server answers those outputs with their top K
        classes, BYTES ``"score:index:label"`` (:mod:`coffea_sonic.classification`); served only.

    >>> TritonModel("triton+grpc://127.0.0.1:8001/jet_tagger").version
    ''
    """

    def __init__(
        self, url: str | Sequence[str], *, timeout_s: float = 60.0,
        max_in_flight: int | None = None, ssl: TlsOptions | Mapping[str, Any] | bool | None = None,
        headers: Mapping[str, str | Secret] | None = None, max_request_bytes: int | None = None,
        connect_timeout_s: float | None = None, nonfinite: NonFinitePolicy | None = None,
        expected_checksum: str | None = None, retry: RetryPolicy | Mapping[str, Any] | None = None,
        fallback: fallback_module.FallbackChoice = None,
        transport: str | Callable[[ServerSettings], Any] | None = None,
        protocol_key: Any = None, priority: int | None = None, cache: CacheChoice = None,
        cache_offline: bool = False, shadow: float | None = None,
        shadow_tolerance: float | None = None, shadow_action: ShadowAction = "raise",
        classification: ClassificationChoice = None, **unknown: Any,
    ) -> None:
        options.unknown_keywords("TritonModel", unknown, _KEYWORDS)
        self.transport = options.checked_transport(transport)
        self.urls = [url] if isinstance(url, str) else list(url)
        self._refs: list[ModelRef] = options.parse_urls(self.urls)
        self._ref = self._refs[0]
        self.url = self.urls[0]
        options.check_limits(timeout_s, max_in_flight, max_request_bytes, priority)
        self.tls, server_tls = options.resolve_tls(ssl, self._refs, self.urls)
        self.headers = normalize_headers(configured_headers() if headers is None else headers)
        if protocol_key is None:
            protocol_key = configured_protocol_key()
        #: how each server is reached (the one settings type of TritonModel, check, monitor)
        self.servers: list[ServerSettings] = [
            ServerSettings.build(ref.address, protocol=ref.protocol, tls=tls,
                                 headers=self.headers, protocol_key=protocol_key)
            for ref, tls in zip(self._refs, server_tls)]
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = options.resolve_connect_timeout(connect_timeout_s)
        self.max_in_flight = max_in_flight
        self.max_request_bytes = max_request_bytes
        self.nonfinite = options.resolve_nonfinite(nonfinite)
        self.expected_checksum = expected_checksum
        self.retry = RetryPolicy.coerce(retry)
        self.fallback = fallback_module.resolve_fallback(fallback)
        self.priority = priority
        #: the persistent inference cache (:mod:`coffea_sonic.cache`), None when off
        self.cache = resolve_cache(cache)
        self.cache_offline = bool(cache_offline)
        if cache_offline and (self.cache is None or not self.version):
            raise ConfigurationError(
                "cache_offline=True answers from the cache while no server is up, so it needs "
                "cache=DIR and a URL that pins the version (.../model/VERSION)")
        #: extension points of every call (:class:`~coffea_sonic.dispatch.CallHooks`), in order;
        #: pickled with the model, so hooks must be picklable to reach Dask workers
        self.call_hooks: tuple[CallHooks, ...] = (TraceHook(),)
        #: fraction of served rows recomputed in-process and compared (:mod:`coffea_sonic.shadow`)
        self.shadow = resolve_shadow(shadow)
        if self.shadow > 0:
            self.call_hooks += (ShadowHook(self.shadow, tolerance=shadow_tolerance,
                                           action=shadow_action, reference=self.fallback),)
        self.classification = check_classification(classification, self.model_name)
        if self.classification and (self.fallback is not None or self.shadow > 0):
            raise ConfigurationError(
                "classification is the server's work (ranked label strings); the in-process "
                "engines of fallback and shadow give scores: use fallback='off' and shadow=0 "
                "with it, or ask for the scores and rank them with numpy")
        self._init_runtime_fields()

    def _init_runtime_fields(self) -> None:
        self.stats = InferenceStats()
        self._stats_lock = threading.Lock()
        self._runtime_lock = threading.Lock()
        self._runtime: CallRunner | None = None

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

    def _get_runtime(self) -> CallRunner:
        """This process' call machinery of this model (made after any fork)."""
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
                runtime = CallRunner(self, router, version=self.version,
                                     stats_lock=self._stats_lock)
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
                            expected_checksum=self.expected_checksum,
                            wait=self.fallback is None and not self.cache_offline)
                    except ServerUnavailableError as error:
                        info = fallback_module.declared_info(self.fallback, self.model_name)
                        if info is None and self.cache_offline:
                            info = self.cache.offline_info(self.model_name, self.version)
                        if info is None:
                            raise
                        fallback_module.warn_fallback(self.model_name, None, str(error))
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
        kind = runtime.sized_window()[1]  # raises where the transport asked for cannot be had
        try:
            self.info  # whether the model runs on a GPU decides between system and CUDA memory
        except SonicError:
            return kind  # e.g. the server is down: its requests will say so
        endpoint = next((e for e in runtime.router.endpoints if e.healthy), None)
        if endpoint is not None and endpoint.data is not None:
            return endpoint.transports.data_transport(runtime.on_gpu).name
        return kind

    def close(self) -> None:
        """Forget this object's per-process state (pooled transports stay for other models)."""
        self._runtime = None

    # -- inference ----------------------------------------------------------------------------------

    def __call__(self, inputs: Mapping[str, Any], *, counts: Any = None) -> dict[str, np.ndarray]:
        """Run the model on ``{input name: array}``; returns ``{output name: array}``.

        ``counts`` (rows per event) makes it a ragged call (:mod:`coffea_sonic.ragged`): the
        inputs are the events' rows, unpadded; per-object outputs come back with one row per
        input row, per-event outputs with one row per event.
        """
        return self._infer(inputs, counts, caller_waits=True).result()

    def infer_async(self, inputs: Mapping[str, Any], *, counts: Any = None) -> InferenceHandle:
        """Validate and send now; the handle's ``result()`` gives what ``__call__`` would."""
        return self._infer(inputs, counts, caller_waits=False)

    def _infer(self, inputs: Mapping[str, Any], counts: Any, caller_waits: bool) -> Any:
        """Validate the call; answer what the inference cache holds and send the rest."""
        info = classified(self.info, self.classification)
        runtime = self._get_runtime()
        # a cached call is looked at whole (its cached rows are never sent); otherwise each
        # request's rows are checked for NaN/inf as it is made, so the first one goes out at once
        per_piece = self.cache is None
        arrays, rows, ragged = runtime.validate(info, inputs, counts, per_piece=per_piece)
        runtime.count(calls=1)
        if self.cache is not None and rows and runtime.version and cacheable(info, arrays):
            return infer_cached(
                self.cache, info, runtime.version, arrays, rows,
                None if ragged is None else ragged.counts,
                lambda sub, sub_rows: runtime.send(info, sub, sub_rows, ragged, caller_waits),
                runtime.count)
        return runtime.send(info, arrays, rows, ragged, caller_waits, per_piece=per_piece)

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
                failures.append(to_sonic_error(
                    error, model=self.model_name, version=self.version, address=endpoint.address,
                    credentials=endpoint.settings.credential_source()))
        if len(failures) == len(runtime.router.endpoints):
            raise failures[0]
        return total

    @contextlib.contextmanager
    def measure_server(self) -> Iterator["ServerDelta"]:
        """Server-side work done while the block runs (queue and compute time, batches); usage:
        docs/internals/incidents.md."""
        sent_before = self.stats.requests + self.stats.failed_requests
        measured = ServerDelta(before=self.server_statistics())
        try:
            yield measured
        finally:  # once the server has counted what this model sent in the block
            sent = self.stats.requests + self.stats.failed_requests - sent_before
            measured.delta = counted_since(self.server_statistics, measured.before, sent)


@dataclass
class ServerDelta:
    """Holder filled by :meth:`TritonModel.measure_server` when its block ends."""

    before: ServerStatistics
    delta: ServerStatistics = field(default_factory=ServerStatistics)


#: the keywords TritonModel takes (an unknown one is named with the closest of these)
_KEYWORDS = tuple(name for name in inspect.signature(TritonModel.__init__).parameters
                  if name not in ("self", "url", "unknown"))
