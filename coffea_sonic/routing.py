"""Several Triton servers behind one model: balancing, health and quarantine (:class:`Router`).

How it works, with an example: docs/internals/routing.md.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from typing import Any, Sequence

from .core.endpoint import ServerSettings
from .core.process_local import ProcessLocal
from .core.tensors import ModelInfo
from . import incidents
from .discovery import Discovery
from .endpoints import Endpoint
from .errors import ConfigurationError, ServerUnavailableError
from .retry import RetryPolicy, call_later
from .transport.base import Transport
from .transport.choice import ServerTransports
from .transport.errors import TransportError

__all__ = ["Endpoint", "RetryPolicy", "Router", "call_later", "get_router"]

logger = logging.getLogger(__name__)


class Router:
    """The servers of one model URL list, in one process (docs/internals/routing.md)."""

    def __init__(self, servers: Sequence[ServerSettings], *, policy: RetryPolicy,
                 connect_timeout_s: float, transport: Any = "auto") -> None:
        if not servers:
            raise ConfigurationError("a router needs at least one server address")
        self.endpoints = [Endpoint(settings, transports=ServerTransports(settings, transport))
                          for settings in servers]
        self.policy = policy
        self.connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._rotation = itertools.count()
        self._rng = random.Random()
        self._health_thread: threading.Thread | None = None
        self._health_wakeup = threading.Event()
        self.discovery = Discovery(self.endpoints, connect_timeout_s=connect_timeout_s,
                                   mark_failed=self.mark_failed, describe=self.describe)

    def __repr__(self) -> str:
        return f"Router({[e.address for e in self.endpoints]})"

    # -- what each server is and serves (kept here for the router's callers) -----------------------

    @staticmethod
    def control(endpoint: Endpoint) -> Transport:
        """The transport of control calls to ``endpoint`` (a factory's transport, if given)."""
        return endpoint.transports.control()

    @staticmethod
    def data_transport(endpoint: Endpoint, gpu_model: bool = False) -> Transport:
        """The transport requests to ``endpoint`` use
        (:meth:`~coffea_sonic.transport.choice.ServerTransports.data_transport`)."""
        return endpoint.transports.data_transport(gpu_model)

    def model_info(self, model: str, version: str, *, timeout_s: float,
                   expected_checksum: str | None = None,
                   wait: bool = True) -> tuple[ModelInfo, str]:
        """The model's signature and the version requests carry (:meth:`Discovery.model_info`);
        waits for servers out of reach within ``total_s`` unless ``wait=False``
        (docs/internals/routing.md)."""
        started = time.monotonic()
        deadline = started + self.policy.total_s
        for attempt in itertools.count(1):
            try:
                return self.discovery.model_info(model, version, timeout_s=timeout_s,
                                                 expected_checksum=expected_checksum)
            except ServerUnavailableError as error:
                left = deadline - time.monotonic()
                if not wait or left <= 0 or not any(e.served is not None for e in self.endpoints):
                    if attempt == 1:
                        raise
                    raise ServerUnavailableError(
                        f"{error} (waited {time.monotonic() - started:.1f} s for a server to "
                        f"come back: the retry policy's total_s is {self.policy.total_s:g} s)"
                    ) from None
                pause = min(left, max(self.seconds_until_probe(),
                                      self.policy.backoff_s(attempt)) + 0.05)
                log = logger.warning if attempt == 1 else logger.info
                log("coffea-sonic: model %s: waiting for a server to come back (%.0f s of the "
                    "retry policy's total_s %g left; next look in %.2f s; no fallback is set): %s",
                    model, left, self.policy.total_s, pause, self.describe(model, version))
                time.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover

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
            seconds = endpoint.quarantine(self.policy, detail)
            endpoint.down_since = time.time()
        logger.warning("coffea-sonic: server %s quarantined for %.1f s after: %s",
                       endpoint.address, seconds, detail)
        incidents.record("quarantined", server=endpoint.address, chunk="", detail=detail)
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
                self.discovery.discover([endpoint], force=True)
            except Exception as error:  # noqa: BLE001 - keep probing; the error is logged
                logger.warning("coffea-sonic: server %s answers but refuses discovery: %s",
                               endpoint.address, error)
            if endpoint.served is None:  # discover quarantined it again
                endpoint.served = previous
                return
            if self.discovery.compatible(endpoint, timeout):
                with self._lock:
                    endpoint.quarantined_until = 0.0
                    endpoint.busy_until = 0.0
                down_s = time.time() - endpoint.down_since if endpoint.down_since else 0.0
                logger.warning("coffea-sonic: server %s re-admitted (healthy again after %.1f s)",
                               endpoint.address, down_s)
                incidents.record("readmitted", server=endpoint.address, chunk="",
                                 detail=f"down {down_s:.1f} s")
            return
        with self._lock:
            seconds = endpoint.quarantine(self.policy, detail)
        logger.info("coffea-sonic: server %s still down (%s); next probe in %.1f s",
                    endpoint.address, detail, seconds)


#: this process' routers (a forked child makes its own; see ProcessLocal)
_routers: ProcessLocal[tuple, Router] = ProcessLocal("routers")


def get_router(servers: Sequence[ServerSettings], *, policy: RetryPolicy,
               connect_timeout_s: float, transport: Any = "auto") -> Router:
    """This process's router for ``servers`` with these settings (made on first use)."""
    key = (tuple(settings.key() for settings in servers), policy, connect_timeout_s,
           transport if isinstance(transport, str) else id(transport))
    return _routers.get(key, lambda: Router(servers, policy=policy,
                                            connect_timeout_s=connect_timeout_s,
                                            transport=transport))


def clear_routers() -> None:
    """Forget every router of this process (tests; a fresh start after servers were replaced)."""
    _routers.clear()
