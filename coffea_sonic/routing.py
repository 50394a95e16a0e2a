"""Several Triton servers behind one model: discovery, balancing, health, quarantine, retries.

A :class:`Router` belongs to one process and one set of servers (shared by every
:class:`~coffea_sonic.model.TritonModel` of that process that names the same servers, so what one
chunk learns about a dead server the next chunk knows too).

* **Discovery**: each server's repository index says which models and versions it serves; a
  request only goes to a server that serves its model and version. Servers that restrict the
  repository protocol (PyTriton's default, ``--grpc-restricted-protocol=model-repository...``)
  are asked per model instead (metadata and readiness stay open there).
* **Transports**: control calls go over the URL's protocol (gRPC or HTTP); requests over the
  transport asked for. ``"auto"`` uses shared memory only with a server on this host that is
  proven to receive both our region registrations and our requests (not a load balancer in
  front of several), and drops back to gRPC for that server on any region error. A model the
  server runs on its GPU 0 alone goes through CUDA shared memory where this process has CUDA and
  the server maps it (:meth:`Router.data_transport`).
* **Balancing**: least outstanding requests among the healthy servers (ties rotate).
* **Quarantine**: a server that fails at the transport level (unreachable, reset, too slow) is
  left alone for ``quarantine_s``, doubling per consecutive failure up to ``max_quarantine_s``.
  A health thread probes it when its time is up (``ServerReady`` + repository index) and
  re-admits it, or extends the quarantine. An overloaded server (queue full) is only deprioritised
  for the backoff time, not quarantined.
* **Retries** (decided by the model, timed by :class:`RetryPolicy`): exponential backoff with
  jitter, on another server where possible, within ``total_s`` per request.

>>> policy = RetryPolicy(initial_backoff_s=0.1, multiplier=2.0, max_backoff_s=1.0, jitter=0.0)
>>> [policy.backoff_s(attempt) for attempt in (1, 2, 3, 4, 5)]
[0.1, 0.2, 0.4, 0.8, 1.0]
>>> RetryPolicy.coerce({"max_attempts": 3}).max_attempts
3
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

from concurrent.futures import ThreadPoolExecutor

from .core.endpoint import ServerSettings
from .core.tensors import ModelInfo
from .errors import ConfigurationError, InferenceError, ModelNotFoundError, ServerUnavailableError
from .transport.base import Transport
from .transport.errors import TransportError, to_sonic_error
from .transport.registry import open_transport


__all__ = ["Endpoint", "RetryPolicy", "Router", "call_later", "get_router"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try before giving up on a request (or handing it to the fallback).

    ``max_attempts`` sends per request (first included) within ``total_s`` seconds from the first
    send; backoff between attempts ``initial_backoff_s * multiplier**(attempt-1)`` capped at
    ``max_backoff_s``, of which a ``jitter`` fraction is random (spreads the retries of many
    workers). ``quarantine_s``/``max_quarantine_s``: how long a failed server is left alone.

    >>> RetryPolicy().max_attempts
    6
    """

    max_attempts: int = 6
    total_s: float = 120.0
    initial_backoff_s: float = 0.05
    multiplier: float = 2.0
    max_backoff_s: float = 2.0
    jitter: float = 0.5
    quarantine_s: float = 0.5
    max_quarantine_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be >= 1, not {self.max_attempts}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigurationError(f"jitter must be within [0, 1], not {self.jitter}")
        if self.total_s <= 0 or self.initial_backoff_s < 0 or self.quarantine_s <= 0:
            raise ConfigurationError("total_s and quarantine_s must be > 0, backoff >= 0")

    @classmethod
    def coerce(cls, value: "RetryPolicy | Mapping[str, Any] | None") -> "RetryPolicy":
        if value is None:
            return cls()
        if isinstance(value, RetryPolicy):
            return value
        if isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ConfigurationError(f"unknown retry option(s) {unknown}; known: {sorted(known)}")
            return cls(**value)
        raise ConfigurationError(f"retry must be a RetryPolicy or a mapping, not {type(value).__name__}")

    def backoff_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """Pause before attempt ``attempt + 1`` (``attempt`` >= 1 sends already failed)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        if not self.jitter:
            return base
        return base * (1.0 - self.jitter * (rng or random).random())


# -- a per-process timer for retries (one thread, not one per retry) ---------------------------------

class _Scheduler:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._counter = itertools.count()
        self._condition = threading.Condition()
        self._thread: threading.Thread | None = None

    def call_later(self, delay_s: float, function: Callable[[], None]) -> None:
        with self._condition:
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay_s),
                                        next(self._counter), function))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="coffea-sonic-retry",
                                                daemon=True)
                self._thread.start()
            self._condition.notify()

    def _run(self) -> None:
        while True:
            with self._condition:
                while True:
                    if not self._heap:
                        # idle: let the thread end instead of lingering in every worker
                        if not self._condition.wait(timeout=5.0) and not self._heap:
                            self._thread = None
                            return
                        continue
                    due, _, function = self._heap[0]
                    delay = due - time.monotonic()
                    if delay <= 0:
                        heapq.heappop(self._heap)
                        break
                    self._condition.wait(timeout=delay)
            try:
                function()
            except Exception:  # noqa: BLE001 - a failing callback must not kill the timer
                logger.exception("coffea-sonic: scheduled retry failed")


_scheduler = _Scheduler()


def call_later(delay_s: float, function: Callable[[], None]) -> None:
    """Run ``function`` in this process's retry thread after ``delay_s`` seconds."""
    _scheduler.call_later(delay_s, function)


# -- servers ------------------------------------------------------------------------------------

@dataclass(eq=False)
class Endpoint:
    """One server as this process sees it."""

    settings: ServerSettings
    outstanding: int = 0
    #: model -> versions ready on this server; None until discovered
    served: dict[str, tuple[str, ...]] | None = None
    #: the server restricts its repository index: models are learnt one by one
    index_restricted: bool = False
    #: monotonic time until which the server is quarantined (0: healthy)
    quarantined_until: float = 0.0
    quarantine_s: float = 0.0
    #: monotonic time until which the server is deprioritised as overloaded
    busy_until: float = 0.0
    consecutive_failures: int = 0
    last_error: str = ""
    #: model -> why this server must not be used for it (signature mismatch)
    incompatible: dict[str, str] = field(default_factory=dict)
    requests: int = 0
    #: why shared memory is not used with this server ("" while undecided or in use)
    shm_off: str = ""
    #: the transport requests use (decided on first use)
    data: Transport | None = None
    #: the transport of requests for models the server runs on a GPU, where CUDA shared memory
    #: works with it (None: not tried yet; see :meth:`Router.data_transport`)
    cuda: Transport | None = None
    #: why CUDA shared memory is not used with this server ("" while undecided or in use)
    cuda_off: str = ""

    @property
    def address(self) -> str:
        return self.settings.address

    @property
    def control(self) -> Transport:
        """The transport of control calls: the URL's protocol (gRPC or HTTP)."""
        return open_transport(self.settings, self.settings.protocol)

    @property
    def healthy(self) -> bool:
        return self.quarantined_until == 0.0

    def serves(self, model: str, version: str) -> bool:
        if self.served is None or model in self.incompatible:
            return False
        versions = self.served.get(model)
        if versions is None:
            return False
        return not version or version in versions

    def state(self, model: str = "", version: str = "") -> str:
        """Human-readable state for error messages (no secrets)."""
        now = time.monotonic()
        if not self.healthy:
            left = max(0.0, self.quarantined_until - now)
            return (f"quarantined for {left:.1f} s more after {self.consecutive_failures} "
                    f"failure(s): {self.last_error or 'unreachable'}")
        if model and model in self.incompatible:
            return self.incompatible[model]
        if model and self.served is not None and not self.serves(model, version):
            have = self.served.get(model)
            return (f"does not serve {model}" + (f" version {version}" if version else "")
                    + (f" (has versions {list(have)})" if have else ""))
        if self.busy_until > now:
            return f"overloaded ({self.last_error})"
        return "healthy"


class Router:
    """The servers of one model URL list, in one process (see the module docstring)."""

    def __init__(self, servers: Sequence[ServerSettings], *, policy: RetryPolicy,
                 connect_timeout_s: float, transport: Any = "auto") -> None:
        if not servers:
            raise ConfigurationError("a router needs at least one server address")
        self.endpoints = [Endpoint(settings) for settings in servers]
        self.policy = policy
        self.connect_timeout_s = connect_timeout_s
        self.transport = transport
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._rotation = itertools.count()
        self._rng = random.Random()
        self._health_thread: threading.Thread | None = None
        self._health_wakeup = threading.Event()
        #: (model, version) -> reference checksum, checked on every (re-)admitted server
        self._signatures: dict[tuple[str, str], str] = {}
        self._infos: dict[tuple[str, str, str], ModelInfo] = {}

    def __repr__(self) -> str:
        return f"Router({[e.address for e in self.endpoints]})"

    # -- transports -------------------------------------------------------------------------------

    def control(self, endpoint: Endpoint) -> Transport:
        """The transport of control calls to ``endpoint`` (a factory's transport, if given)."""
        if callable(self.transport):
            return self.transport(endpoint.settings)
        return endpoint.control

    def data_transport(self, endpoint: Endpoint, gpu_model: bool = False) -> Transport:
        """The transport requests to ``endpoint`` use (chosen once, see the module docstring).

        ``gpu_model``: the request's model runs on the server's GPU 0 (only: see
        :attr:`~coffea_sonic.core.tensors.ModelInfo.on_gpu_zero`). With ``"auto"``, where system
        shared memory works with the server, such requests go through CUDA shared memory if this
        process can allocate GPU memory the server maps (:meth:`_cuda`): the server then reads
        the inputs on its GPU, without its host copies (one client process on an H200: 0.54x
        in-process with CUDA memory against 0.38x with system memory, benchmarks/RESULTS.md).
        """
        data = endpoint.data
        if data is None or (data.name in ("shm", "cuda") and endpoint.shm_off):
            data = endpoint.data = self._choose(endpoint)
        if gpu_model and data.name == "shm" and self.transport == "auto":
            return self._cuda(endpoint) or data
        return data

    def _cuda(self, endpoint: Endpoint) -> Transport | None:
        """``endpoint``'s CUDA shared-memory transport, or None where it does not work."""
        if endpoint.cuda is not None or endpoint.cuda_off:
            return endpoint.cuda
        with self._lock:
            if endpoint.cuda is not None or endpoint.cuda_off:
                return endpoint.cuda
            why = ""
            try:
                from .transport.shm.cuda import probe_cuda_shared_memory

                usable, why = probe_cuda_shared_memory(endpoint.control)
                if usable:
                    endpoint.cuda = open_transport(endpoint.settings, "cuda")
            except Exception as error:  # noqa: BLE001 - e.g. CUDA unusable after a fork
                usable, why = False, f"{type(error).__name__}: {error}"
            if not usable:
                endpoint.cuda_off = why or "CUDA shared memory failed"
        logger.info("coffea-sonic: GPU models of %s: %s", endpoint.address,
                    "CUDA shared memory" if endpoint.cuda is not None
                    else f"system shared memory ({endpoint.cuda_off})")
        return endpoint.cuda

    def _choose(self, endpoint: Endpoint) -> Transport:
        requested = self.transport
        if callable(requested):
            return requested(endpoint.settings)
        settings = endpoint.settings
        if requested == "http" and settings.protocol != "http":
            raise ConfigurationError(
                f"transport='http' needs triton+http:// URLs (the server's HTTP port), not "
                f"{settings.address} over gRPC")
        if requested in ("grpc", "http") or settings.protocol == "http":
            return endpoint.control
        if endpoint.shm_off:
            if requested in ("shm", "cuda"):
                raise ConfigurationError(
                    f"transport={requested!r}: cannot use shared memory with {settings.address} "
                    f"({endpoint.shm_off}); use transport='auto' or 'grpc'")
            return endpoint.control
        from .transport.shm import probe_shared_memory, shm_possible

        usable, why = (False, "the server is not on this host")
        if shm_possible(settings.address):
            usable, why = probe_shared_memory(endpoint.control)
        if not usable:
            self.disable_shm(endpoint, why, quiet=requested == "auto")
            return self._choose(endpoint)
        return open_transport(settings, "cuda" if requested == "cuda" else "shm")

    def disable_shm(self, endpoint: Endpoint, why: str, quiet: bool = False) -> None:
        """Stop using shared memory with ``endpoint`` (logged once); requests go over gRPC."""
        with self._lock:
            if endpoint.shm_off:
                return
            endpoint.shm_off = why or "shared memory failed"
        log = logger.info if quiet else logger.warning
        log("coffea-sonic: not using shared memory with %s (%s); sending tensors over %s",
            endpoint.address, endpoint.shm_off, endpoint.settings.protocol)

    # -- discovery --------------------------------------------------------------------------------

    def discover(self, endpoints: Sequence[Endpoint] | None = None, *, force: bool = False) -> None:
        """Ask servers not yet discovered what they serve (all at once, in parallel).

        A server that cannot be reached within the connect timeout is quarantined; one that
        restricts its repository index is asked model by model later (:meth:`_learn`).
        """
        pending = [e for e in (endpoints or self.endpoints) if force or e.served is None]
        if not pending:
            return
        with ThreadPoolExecutor(len(pending), thread_name_prefix="csonic-discover") as pool:
            answers = list(pool.map(self._index, pending))
        for endpoint, answer in zip(pending, answers):
            if isinstance(answer, TransportError):
                if answer.kind == "restricted":
                    endpoint.index_restricted, endpoint.served = True, {}
                    logger.info("coffea-sonic: %s restricts its repository index; asking for "
                                "each model instead", endpoint.address)
                elif answer.outcome == "other":  # it answered: e.g. our token was refused
                    raise to_sonic_error(answer, model="(repository index)",
                                         address=endpoint.address)
                else:
                    self.mark_failed(endpoint, answer.describe())
                continue
            endpoint.index_restricted, endpoint.served = False, answer

    def _index(self, endpoint: Endpoint) -> dict[str, tuple[str, ...]] | TransportError:
        try:
            return self.control(endpoint).model_index(self.connect_timeout_s)
        except TransportError as error:
            return error
        except Exception as error:  # noqa: BLE001 - e.g. unreadable TLS files
            return TransportError("down", f"{type(error).__name__}: {error}",
                                  address=endpoint.address)

    def _learn(self, endpoint: Endpoint, model: str, timeout_s: float) -> None:
        """Fill ``endpoint.served[model]`` from the model's metadata (restricted index)."""
        if not endpoint.index_restricted or endpoint.served is None or model in endpoint.served:
            return
        try:
            info = self._info(endpoint, model, "", timeout_s)
        except TransportError as error:
            if error.kind == "not_found":
                endpoint.served[model] = ()
            elif error.outcome == "other":
                raise to_sonic_error(error, model=model, address=endpoint.address) from None
            else:
                self.mark_failed(endpoint, error.describe())
            return
        endpoint.served[model] = info.versions

    def _info(self, endpoint: Endpoint, model: str, version: str, timeout_s: float,
              refresh: bool = False) -> ModelInfo:
        key = (endpoint.address, model, version)
        info = None if refresh else self._infos.get(key)
        if info is None:
            info = self._infos[key] = self.control(endpoint).model_info(model, version, timeout_s)
        return info

    def model_info(self, model: str, version: str, *,
                   timeout_s: float, expected_checksum: str | None = None) -> tuple[ModelInfo, str]:
        """The model's signature and the version requests will carry, checked on every server.

        Unpinned (``version == ""``): the highest version any reachable server has, so every chunk
        of the run uses the same model. Raises ``ModelNotFoundError`` if no reachable server
        serves it, ``InferenceError`` if two servers (or a server and ``expected_checksum``)
        disagree about its signature.
        """
        self.discover()
        for endpoint in self.endpoints:
            if endpoint.healthy:
                self._learn(endpoint, model, timeout_s)
        reachable = [e for e in self.endpoints if e.served is not None and e.healthy]
        if not reachable:
            raise ServerUnavailableError(
                f"model {model!r}: no server reachable within {self.connect_timeout_s:g} s "
                "(is the server running, and are the address and TLS setting right?); "
                + self.describe(model, version))
        if not version:
            latest = [max((v for v in e.served.get(model, ()) if v.isdigit()), key=int, default="")
                      for e in reachable]
            version = max((v for v in latest if v), key=int, default="")
        holders = [e for e in reachable if e.serves(model, version)]
        if not holders:
            what = f"model {model!r}" + (f" version {version}" if version else "")
            listing = "; ".join(
                f"{e.address} serves " + ("(its repository index is restricted)"
                                          if e.index_restricted and not e.served.get(model)
                                          else ", ".join(
                    f"{name} (versions {', '.join(v) or '?'})" for name, v in e.served.items()
                    if v) or "nothing")
                for e in reachable)
            raise ModelNotFoundError(f"no server serves {what}: {listing}")
        reference: ModelInfo | None = None
        reference_address = ""
        for endpoint in holders:
            info = self._fetch_info(endpoint, model, version, timeout_s)
            if info is None:
                continue
            if expected_checksum and info.checksum != expected_checksum:
                raise InferenceError(
                    f"model {model!r} at {endpoint.address} has signature checksum "
                    f"{info.checksum}, expected {expected_checksum}: the served model is not the "
                    f"one this analysis was written for ({info.describe()})")
            if reference is None:
                reference, reference_address = info, endpoint.address
            elif info.checksum != reference.checksum:
                raise InferenceError(
                    f"servers disagree about model {model!r} version {version or 'latest'}: "
                    f"{reference_address} serves {reference.describe()} (checksum "
                    f"{reference.checksum}) but {endpoint.address} serves {info.describe()} "
                    f"(checksum {info.checksum}); deploy the same model everywhere")
        if reference is None:
            raise ServerUnavailableError(
                f"model {model!r}: every server holding it failed to describe it; "
                + self.describe(model, version))
        self._signatures[(model, version)] = reference.checksum
        return reference, version

    def _fetch_info(self, endpoint: Endpoint, model: str, version: str,
                    timeout_s: float, refresh: bool = False) -> ModelInfo | None:
        try:
            return self._info(endpoint, model, version, timeout_s, refresh)
        except TransportError as error:
            if error.outcome == "other":
                raise to_sonic_error(error, model=model, version=version,
                                     address=endpoint.address) from None
            self.mark_failed(endpoint, error.describe())
            return None

    # -- choosing and releasing ---------------------------------------------------------------------

    def acquire(self, model: str, version: str, avoid: frozenset[str] = frozenset()) -> Endpoint | None:
        """The least-loaded healthy server for ``model``/``version`` (preferring those not in
        ``avoid`` and not overloaded), with one more outstanding request; None if none."""
        now = time.monotonic()
        with self._lock:
            candidates = [e for e in self.endpoints if e.healthy and e.serves(model, version)]
            if not candidates:
                return None
            preferred = [e for e in candidates if e.address not in avoid and e.busy_until <= now]
            pool = preferred or [e for e in candidates if e.busy_until <= now] or candidates
            lowest = min(e.outstanding for e in pool)
            tied = [e for e in pool if e.outstanding == lowest]
            chosen = tied[next(self._rotation) % len(tied)]
            chosen.outstanding += 1
            chosen.requests += 1
            return chosen

    def release(self, endpoint: Endpoint, outcome: str, detail: str = "") -> None:
        """Account for an answered request: ``ok``, ``down`` (quarantine), ``busy`` (back off).

        ``other`` means the server answered with an error about the request itself.
        """
        with self._lock:
            endpoint.outstanding -= 1
        if outcome == "down":
            self.mark_failed(endpoint, detail)
        elif outcome == "busy":
            with self._lock:
                endpoint.last_error = detail
                endpoint.busy_until = time.monotonic() + self.policy.backoff_s(
                    max(1, endpoint.consecutive_failures + 1), self._rng)
        elif outcome == "ok":
            if endpoint.consecutive_failures and endpoint.healthy:
                with self._lock:
                    endpoint.consecutive_failures = 0
                    endpoint.quarantine_s = 0.0

    def mark_failed(self, endpoint: Endpoint, detail: str) -> None:
        """Quarantine ``endpoint`` (doubling its quarantine) and wake the health thread."""
        with self._lock:
            if not endpoint.healthy:  # several in-flight failures of one outage count once
                endpoint.last_error = detail or endpoint.last_error
                return
            endpoint.consecutive_failures += 1
            endpoint.quarantine_s = min(self.policy.max_quarantine_s,
                                        max(self.policy.quarantine_s, endpoint.quarantine_s * 2))
            endpoint.quarantined_until = time.monotonic() + endpoint.quarantine_s
            endpoint.last_error = detail
        logger.warning("coffea-sonic: server %s quarantined for %.1f s after: %s",
                       endpoint.address, endpoint.quarantine_s, detail)
        self._ensure_health_thread()

    def available(self, model: str, version: str) -> bool:
        """Whether some healthy server serves ``model``/``version`` right now."""
        return any(e.healthy and e.serves(model, version) for e in self.endpoints)

    def could_serve(self, model: str, version: str) -> bool:
        """Whether any server, healthy or not (or not yet discovered), may serve it at all."""
        return any(e.served is None or e.serves(model, version)
                   or (e.index_restricted and model not in e.served) for e in self.endpoints)

    def seconds_until_probe(self) -> float:
        """Time until the next quarantined server is probed (0 when none is quarantined)."""
        now = time.monotonic()
        waits = [e.quarantined_until - now for e in self.endpoints if not e.healthy]
        return max(0.0, min(waits)) if waits else 0.0

    def describe(self, model: str = "", version: str = "") -> str:
        """``tried: address (state), ...`` for error messages and logs."""
        return "servers tried: " + ", ".join(f"{e.address} ({e.state(model, version)})"
                                             for e in self.endpoints)

    # -- health -------------------------------------------------------------------------------------

    def _ensure_health_thread(self) -> None:
        with self._lock:
            if self._health_thread is not None and self._health_thread.is_alive():
                self._health_wakeup.set()
                return
            self._health_thread = threading.Thread(target=self._health_loop,
                                                   name="coffea-sonic-health", daemon=True)
            self._health_thread.start()

    def _health_loop(self) -> None:
        while True:
            with self._lock:
                quarantined = [e for e in self.endpoints if not e.healthy]
                if not quarantined:
                    self._health_thread = None
                    return
            wait = self.seconds_until_probe()
            if wait > 0:
                self._health_wakeup.wait(timeout=min(wait, 1.0))
                self._health_wakeup.clear()
                continue
            now = time.monotonic()
            for endpoint in quarantined:
                if endpoint.quarantined_until <= now:
                    self._probe(endpoint)

    def _probe(self, endpoint: Endpoint) -> None:
        timeout = min(self.connect_timeout_s, 2.0)
        try:
            ready = self.control(endpoint).ready(timeout)
            detail = "server not ready"
        except TransportError as error:
            ready, detail = False, error.describe()
        if ready:
            previous = endpoint.served
            endpoint.served = None
            try:
                self.discover([endpoint])
            except Exception as error:  # noqa: BLE001 - keep probing; the error is logged
                logger.warning("coffea-sonic: server %s answers but refuses discovery: %s",
                               endpoint.address, error)
            if endpoint.served is None:  # discover quarantined it again
                endpoint.served = previous
                return
            if self._compatible(endpoint, timeout):
                with self._lock:
                    endpoint.quarantined_until = 0.0
                    endpoint.busy_until = 0.0
                logger.warning("coffea-sonic: server %s re-admitted (healthy again)",
                               endpoint.address)
            return
        with self._lock:
            endpoint.consecutive_failures += 1
            endpoint.quarantine_s = min(self.policy.max_quarantine_s,
                                        max(self.policy.quarantine_s, endpoint.quarantine_s * 2))
            endpoint.quarantined_until = time.monotonic() + endpoint.quarantine_s
            endpoint.last_error = detail
        logger.info("coffea-sonic: server %s still down (%s); next probe in %.1f s",
                    endpoint.address, detail, endpoint.quarantine_s)

    def _compatible(self, endpoint: Endpoint, timeout_s: float) -> bool:
        """Re-check the signatures of the models in use on a re-admitted server."""
        for (model, version), checksum in list(self._signatures.items()):
            try:
                self._learn(endpoint, model, timeout_s)
            except Exception:  # noqa: BLE001 - treated as not serving it
                continue
            if not endpoint.serves(model, version):
                continue
            info = self._fetch_info(endpoint, model, version, timeout_s, refresh=True)
            if info is None:
                return False
            if info.checksum != checksum:
                reason = (f"serves a different {model!r} (checksum {info.checksum}, expected "
                          f"{checksum}: {info.describe()})")
                endpoint.incompatible[model] = reason
                logger.error("coffea-sonic: server %s %s; not using it for %s",
                             endpoint.address, reason, model)
        return True


_routers: dict[tuple, Router] = {}
_routers_pid = os.getpid()
_routers_lock = threading.Lock()


#: Routers and scheduler inherited from a parent process: kept referenced so that nothing of the
#: parent's is finalized (channels closed, threads joined) in a forked child.
_inherited: list = []


def _reset_after_fork() -> None:
    global _routers, _routers_pid, _routers_lock, _scheduler
    _inherited.append((_routers, _scheduler))
    _routers, _routers_pid, _routers_lock = {}, os.getpid(), threading.Lock()
    _scheduler = _Scheduler()


os.register_at_fork(after_in_child=_reset_after_fork)


def get_router(servers: Sequence[ServerSettings], *, policy: RetryPolicy,
               connect_timeout_s: float, transport: Any = "auto") -> Router:
    """This process's router for ``servers`` with these settings (made on first use)."""
    key = (tuple(settings.key() for settings in servers), policy, connect_timeout_s,
           transport if isinstance(transport, str) else id(transport))
    router = _routers.get(key)
    if router is not None and router.pid == os.getpid():
        return router
    with _routers_lock:
        router = _routers.get(key)
        if router is None or router.pid != os.getpid():
            router = Router(servers, policy=policy, connect_timeout_s=connect_timeout_s,
                            transport=transport)
            _routers[key] = router
        return router


def clear_routers() -> None:
    """Forget every router of this process (tests; a fresh start after servers were replaced)."""
    with _routers_lock:
        _routers.clear()
