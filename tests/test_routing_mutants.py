"""The router's bookkeeping and defaults (coffea_sonic.routing), in-process.

The routers point at closed loopback ports (a connection there is refused at once) or at a
documentation address (192.0.2.1, never on this host); what each endpoint serves is set by
hand, as discovery would.
"""
from __future__ import annotations

import logging
import random
import threading
import time

import pytest

from coffea_sonic import incidents
from coffea_sonic.core.endpoint import ServerSettings
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.retry import RetryPolicy
from coffea_sonic.routing import Router, clear_routers, get_router

POLICY = RetryPolicy(jitter=0.0, initial_backoff_s=5.0, max_backoff_s=5.0, quarantine_s=60.0,
                     max_quarantine_s=60.0)


def _router(count: int = 2, policy: RetryPolicy = POLICY) -> Router:
    router = Router([ServerSettings(f"127.0.0.1:{port}") for port in range(1, count + 1)],
                    policy=policy, connect_timeout_s=0.5)
    for endpoint in router.endpoints:
        endpoint.served = {"m": ("1", "2")}
    return router


def test_a_router_without_servers_is_refused_with_the_whole_reason():
    with pytest.raises(ConfigurationError, match="^a router needs at least one server address$"):
        Router([], policy=POLICY, connect_timeout_s=0.1)


def test_a_router_made_without_a_transport_chooses_as_auto_does(caplog):
    router = Router([ServerSettings("192.0.2.1:8001")], policy=POLICY, connect_timeout_s=0.1)
    (endpoint,) = router.endpoints
    assert endpoint.transports.requested == "auto"
    with caplog.at_level(logging.INFO, logger="coffea_sonic.transport.choice"):
        assert Router.data_transport(endpoint).name == "grpc"
    # auto falls back from shared memory quietly: a server off this host is no mistake
    assert [r.levelno for r in caplog.records] == [logging.INFO]


def test_each_acquire_counts_one_more_outstanding_and_one_more_request():
    router = _router(1)
    (endpoint,) = router.endpoints
    for count in (1, 2, 3):
        assert router.acquire("m", "1") is endpoint
        assert (endpoint.outstanding, endpoint.requests) == (count, count)
    router.release(endpoint, "ok")
    assert (endpoint.outstanding, endpoint.requests) == (2, 3)


def test_a_down_answer_quarantines_the_server_with_its_reason_or_none():
    router = _router(2)
    first, second = router.endpoints
    router.release(router.acquire("m", "1"), "down", "UNAVAILABLE: connection reset")
    assert not first.healthy and first.last_error == "UNAVAILABLE: connection reset"
    router.release(router.acquire("m", "1"), "down")
    assert not second.healthy and second.last_error == ""
    assert second.state().endswith("failure(s): unreachable")
    _end_quarantines(router)


def test_a_quarantine_belongs_to_no_chunk_even_when_a_chunk_sees_it():
    router = _router(1)
    incidents.take()  # what earlier tests left pending
    with incidents.chunk_context("events.root:0-100"):
        router.mark_failed(router.endpoints[0], "UNAVAILABLE: connection refused")
    assert [(i.kind, i.chunk) for i in incidents.take() if i.kind == "quarantined"] == [
        ("quarantined", "")]
    _end_quarantines(router)


def test_describe_without_a_model_or_version_says_only_health():
    router = _router(2)
    assert router.describe() == "servers tried: 127.0.0.1:1 (healthy), 127.0.0.1:2 (healthy)"
    assert router.describe("m") == router.describe()


def test_busy_backoffs_are_drawn_apart_from_a_seeded_global_random():
    # workers that seed Python's random alike must still spread their retries
    policy = RetryPolicy(jitter=1.0, initial_backoff_s=100.0, max_backoff_s=100.0)
    pauses = []
    for _ in range(3):
        router = _router(1, policy)
        (endpoint,) = router.endpoints
        random.seed(7)
        before = time.monotonic()
        router.release(router.acquire("m", "1"), "busy", "queue full")
        pauses.append((endpoint.busy_until - time.monotonic(), endpoint.busy_until - before))
    random.seed()
    low, high = min(pauses), max(pauses)
    assert high[0] > low[1], f"three routers drew the same jitter: {pauses}"


def test_the_health_thread_outlives_a_second_quarantine_and_ends_with_the_last(monkeypatch):
    failures: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    router = _router(2, RetryPolicy(quarantine_s=60.0, max_quarantine_s=60.0))
    first, second = router.endpoints
    router.mark_failed(first, "UNAVAILABLE: connection refused")
    thread = router._health_thread
    router.mark_failed(second, "UNAVAILABLE: connection refused")  # wakes the same thread
    assert router._health_thread is thread
    deadline = time.monotonic() + 30
    while router._health_wakeup.is_set() and time.monotonic() < deadline:
        thread.join(timeout=0.01)  # the thread takes the wake-up
    assert thread.is_alive() and not router._health_wakeup.is_set() and not failures
    _end_quarantines(router)
    thread.join(timeout=30)
    assert not thread.is_alive() and router._health_thread is None and not failures


def test_a_probe_of_a_server_that_refuses_connections_extends_its_quarantine(caplog):
    router = _router(1, RetryPolicy(quarantine_s=30.0, max_quarantine_s=300.0))
    (endpoint,) = router.endpoints
    with router._lock:
        endpoint.quarantine(router.policy, "UNAVAILABLE: connection refused")
    with caplog.at_level(logging.INFO, logger="coffea_sonic.routing"):
        router._probe(endpoint)
    assert not endpoint.healthy and endpoint.consecutive_failures == 2
    assert endpoint.quarantine_s == 60.0 and "Connection refused" in endpoint.last_error
    # this thread's records only: other routers' health threads may log meanwhile
    (message,) = [r.getMessage() for r in caplog.records
                  if r.thread == threading.get_ident()]
    assert message.startswith("coffea-sonic: server 127.0.0.1:1 still down (UNAVAILABLE")
    assert message.endswith("); next probe in 60.0 s")


def test_get_router_defaults_to_auto_and_keys_a_named_transport_by_its_name():
    servers = [ServerSettings("127.0.0.1:1")]
    clear_routers()
    try:
        auto = get_router(servers, policy=POLICY, connect_timeout_s=0.1)
        assert get_router(servers, policy=POLICY, connect_timeout_s=0.1, transport="auto") is auto
        assert auto.endpoints[0].transports.requested == "auto"
        spelled = "".join(["gr", "pc"])  # equal to "grpc", another object
        grpc = get_router(servers, policy=POLICY, connect_timeout_s=0.1, transport="grpc")
        assert get_router(servers, policy=POLICY, connect_timeout_s=0.1,
                          transport=spelled) is grpc is not auto
    finally:
        clear_routers()


class _Factory:
    """A transport factory that compares equal to every other one, so it cannot be hashed."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Factory)

    __hash__ = None  # type: ignore[assignment]

    def __call__(self, settings: ServerSettings):
        from coffea_sonic.transport.choice import ServerTransports

        return ServerTransports(settings, "grpc").plain


def test_get_router_keeps_one_router_per_factory_object_hashable_or_not():
    servers = [ServerSettings("127.0.0.1:1")]
    clear_routers()
    try:
        one, other = _Factory(), _Factory()
        first = get_router(servers, policy=POLICY, connect_timeout_s=0.1, transport=one)
        assert get_router(servers, policy=POLICY, connect_timeout_s=0.1, transport=one) is first
        second = get_router(servers, policy=POLICY, connect_timeout_s=0.1, transport=other)
        assert second is not first
        assert Router.control(first.endpoints[0]).name == "grpc"
    finally:
        clear_routers()


def _end_quarantines(router: Router) -> None:
    """Re-admit every server, so the health thread ends instead of probing later tests' time."""
    with router._lock:
        for endpoint in router.endpoints:
            endpoint.quarantined_until = 0.0
    router._health_wakeup.set()
    thread = router._health_thread
    if thread is not None:
        thread.join(timeout=30)
