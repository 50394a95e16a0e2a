"""Edges of the router's choices (coffea_sonic.routing's parts that talk to no server).

The routers here point at closed ports and what each endpoint serves is set by hand, as
discovery would: the choices under test never send anything.
"""
from __future__ import annotations

import time

import pytest

from coffea_sonic.core.endpoint import ServerSettings
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.retry import RetryPolicy
from coffea_sonic.routing import Router, clear_routers, get_router

POLICY = RetryPolicy(jitter=0.0, initial_backoff_s=5.0, max_backoff_s=5.0)


def _router(count: int = 2) -> Router:
    router = Router([ServerSettings(f"127.0.0.1:{port}") for port in range(1, count + 1)],
                    policy=POLICY, connect_timeout_s=0.1)
    for endpoint in router.endpoints:
        endpoint.served = {"m": ("1", "2")}
    return router


def test_a_router_needs_a_server_and_names_its_addresses():
    with pytest.raises(ConfigurationError, match="at least one server address"):
        Router([], policy=POLICY, connect_timeout_s=0.1)
    assert repr(_router()) == "Router(['127.0.0.1:1', '127.0.0.1:2'])"


def test_the_least_loaded_server_is_chosen_and_ties_take_turns():
    router = _router(3)
    first, second, third = router.endpoints
    picked = [router.acquire("m", "1") for _ in range(3)]
    assert sorted(e.address for e in picked) == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    assert [e.outstanding for e in router.endpoints] == [1, 1, 1]
    assert [e.requests for e in router.endpoints] == [1, 1, 1]
    router.release(second, "ok")
    assert router.acquire("m", "1") is second
    third.outstanding = 5
    router.release(first, "ok")
    router.release(second, "ok")
    assert {router.acquire("m", "") .address for _ in range(2)} == {"127.0.0.1:1", "127.0.0.1:2"}


def test_avoided_and_overloaded_servers_are_used_only_when_nothing_else_is_left():
    router = _router(2)
    first, second = router.endpoints
    assert router.acquire("m", "1", avoid=frozenset({first.address})) is second
    second.outstanding = 0
    second.busy_until = time.monotonic() + 60
    assert router.acquire("m", "1", avoid=frozenset({first.address})) is first
    first.outstanding = 0
    first.busy_until = time.monotonic() + 60
    assert router.acquire("m", "1") in (first, second)
    first.busy_until = second.busy_until = 0.0
    first.outstanding = second.outstanding = 0
    assert router.acquire("m", "1", avoid=frozenset({first.address, second.address})) is not None


def test_nothing_is_chosen_where_no_healthy_server_serves_the_model():
    router = _router(2)
    assert router.acquire("other", "") is None
    assert router.acquire("m", "3") is None
    router.endpoints[0].quarantined_until = time.monotonic() + 60
    assert router.acquire("m", "1") is router.endpoints[1]
    router.endpoints[1].quarantined_until = time.monotonic() + 60
    assert router.acquire("m", "1") is None
    assert not router.available("m", "1")


def test_a_busy_answer_backs_the_server_off_and_an_ok_one_forgives_failures():
    router = _router(1)
    (endpoint,) = router.endpoints
    chosen = router.acquire("m", "1")
    before = time.monotonic()
    router.release(chosen, "busy", "try later")
    assert endpoint.outstanding == 0 and endpoint.last_error == "try later"
    assert before + 4.0 < endpoint.busy_until <= time.monotonic() + 5.0
    endpoint.consecutive_failures, endpoint.quarantine_s = 2, 4.0
    router.release(router.acquire("m", "1"), "ok")
    assert (endpoint.consecutive_failures, endpoint.quarantine_s) == (0, 0.0)
    endpoint.consecutive_failures, endpoint.quarantine_s = 2, 4.0
    router.release(router.acquire("m", "1"), "other", "bad request")
    assert (endpoint.consecutive_failures, endpoint.quarantine_s) == (2, 4.0)
    endpoint.quarantined_until = time.monotonic() + 60
    endpoint.outstanding = 1
    router.release(endpoint, "ok")
    assert endpoint.consecutive_failures == 2


def test_a_failure_of_a_server_already_quarantined_counts_once():
    router = _router(1)
    (endpoint,) = router.endpoints
    endpoint.quarantined_until = time.monotonic() + 60
    endpoint.consecutive_failures, endpoint.last_error = 1, "first"
    router.mark_failed(endpoint, "second")
    assert (endpoint.consecutive_failures, endpoint.last_error) == (1, "second")
    router.mark_failed(endpoint, "")
    assert endpoint.last_error == "second"


def test_availability_and_what_could_serve():
    router = _router(2)
    assert router.available("m", "2") and not router.available("m", "9")
    assert router.could_serve("m", "1") and not router.could_serve("x", "")
    router.endpoints[0].served = None
    assert router.could_serve("x", "")
    router.endpoints[0].served = {"m": ("1",)}
    router.endpoints[1].index_restricted = True
    assert router.could_serve("x", "") and not router.could_serve("m", "9")


def test_the_next_probe_is_the_soonest_quarantine_end():
    router = _router(3)
    assert router.seconds_until_probe() == 0.0
    now = time.monotonic()
    router.endpoints[0].quarantined_until = now + 30
    router.endpoints[1].quarantined_until = now + 10
    assert 8.0 < router.seconds_until_probe() <= 10.0
    router.endpoints[1].quarantined_until = now - 5
    assert router.seconds_until_probe() == 0.0


def test_describe_lists_every_server_with_its_state():
    router = _router(2)
    router.endpoints[1].served = {"m": ("1",)}
    assert router.describe("m", "2") == ("servers tried: 127.0.0.1:1 (healthy), 127.0.0.1:2 "
                                         "(does not serve m version 2 (has versions ['1']))")


def test_one_router_per_servers_and_settings_until_cleared():
    servers = [ServerSettings("127.0.0.1:1")]
    first = get_router(servers, policy=POLICY, connect_timeout_s=0.1)
    assert get_router(servers, policy=POLICY, connect_timeout_s=0.1) is first
    assert get_router(servers, policy=POLICY, connect_timeout_s=0.2) is not first
    assert get_router(servers, policy=RetryPolicy(), connect_timeout_s=0.1) is not first
    clear_routers()
    assert get_router(servers, policy=POLICY, connect_timeout_s=0.1) is not first
    clear_routers()


def test_a_busy_server_backs_off_by_its_failures_so_far():
    policy = RetryPolicy(jitter=0.0, initial_backoff_s=1.0, multiplier=2.0, max_backoff_s=100.0)
    router = Router([ServerSettings("127.0.0.1:1")], policy=policy, connect_timeout_s=0.1)
    (endpoint,) = router.endpoints
    endpoint.served = {"m": ("1",)}
    for failures, pause in ((0, 1.0), (2, 4.0)):
        endpoint.consecutive_failures = failures
        before = time.monotonic()
        router.release(router.acquire("m", "1"), "busy", "overloaded")
        assert before + pause <= endpoint.busy_until <= time.monotonic() + pause


def test_a_quarantine_is_logged_and_left_on_record_with_the_server_and_the_reason(caplog):
    import logging

    from coffea_sonic import incidents

    router = _router(1)
    (endpoint,) = router.endpoints
    incidents.take()  # what earlier tests left pending
    before = time.time()
    with caplog.at_level(logging.WARNING, logger="coffea_sonic.routing"):
        router.mark_failed(endpoint, "UNAVAILABLE: connection refused")
    assert endpoint.last_error == "UNAVAILABLE: connection refused"
    assert before <= endpoint.down_since <= time.time()
    assert [r.getMessage() for r in caplog.records] == [
        "coffea-sonic: server 127.0.0.1:1 quarantined for 0.5 s after: "
        "UNAVAILABLE: connection refused"]
    quarantined = [i for i in incidents.take() if i.kind == "quarantined"]
    assert [(i.server, i.chunk, i.detail) for i in quarantined] == [
        ("127.0.0.1:1", "", "UNAVAILABLE: connection refused")]
