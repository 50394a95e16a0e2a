"""Edges of the retry policy and the per-process retry timer (coffea_sonic.retry): in-process."""
from __future__ import annotations

import random
import threading

import pytest

from coffea_sonic.errors import ConfigurationError
from coffea_sonic.retry import RetryPolicy, call_later


def test_the_defaults_are_the_documented_ones():
    assert RetryPolicy() == RetryPolicy(max_attempts=6, total_s=120.0, initial_backoff_s=0.05,
                                        multiplier=2.0, max_backoff_s=2.0, jitter=0.5,
                                        quarantine_s=0.5, max_quarantine_s=30.0)
    assert (RetryPolicy().max_attempts, RetryPolicy().total_s, RetryPolicy().initial_backoff_s,
            RetryPolicy().multiplier, RetryPolicy().max_backoff_s, RetryPolicy().jitter,
            RetryPolicy().quarantine_s, RetryPolicy().max_quarantine_s) == (
                6, 120.0, 0.05, 2.0, 2.0, 0.5, 0.5, 30.0)


def test_a_policy_cannot_be_changed_after_it_is_made():
    with pytest.raises(AttributeError):
        RetryPolicy().max_attempts = 3  # type: ignore[misc]


@pytest.mark.parametrize("options", [dict(max_attempts=1), dict(jitter=0.0), dict(jitter=1.0),
                                     dict(initial_backoff_s=0.0), dict(total_s=0.001),
                                     dict(quarantine_s=0.001)])
def test_the_edges_of_the_allowed_ranges_are_allowed(options):
    RetryPolicy(**options)


@pytest.mark.parametrize("options, message", [
    (dict(max_attempts=0), "max_attempts must be >= 1, not 0"),
    (dict(jitter=-0.01), "jitter must be within"), (dict(jitter=1.01), "jitter must be within"),
    (dict(total_s=0.0), "total_s and quarantine_s must be > 0"),
    (dict(initial_backoff_s=-0.01), "backoff >= 0"),
    (dict(quarantine_s=0.0), "total_s and quarantine_s must be > 0")])
def test_values_outside_the_ranges_are_refused(options, message):
    with pytest.raises(ConfigurationError, match=message):
        RetryPolicy(**options)


def test_coerce_takes_none_a_policy_or_a_mapping_of_known_options():
    assert RetryPolicy.coerce(None) == RetryPolicy()
    policy = RetryPolicy(max_attempts=2)
    assert RetryPolicy.coerce(policy) is policy
    assert RetryPolicy.coerce({"max_attempts": 3}) == RetryPolicy(max_attempts=3)
    with pytest.raises(ConfigurationError, match=r"unknown retry option\(s\) \['tries'\]"):
        RetryPolicy.coerce({"tries": 3, "max_attempts": 3})
    with pytest.raises(ConfigurationError, match="not int"):
        RetryPolicy.coerce(3)  # type: ignore[arg-type]


def test_backoff_grows_by_the_multiplier_up_to_its_cap_without_jitter():
    policy = RetryPolicy(initial_backoff_s=0.1, multiplier=3.0, max_backoff_s=1.0, jitter=0.0)
    assert [round(policy.backoff_s(a), 9) for a in (1, 2, 3, 4)] == [0.1, 0.3, 0.9, 1.0]


def test_jitter_takes_a_random_fraction_off_the_backoff():
    policy = RetryPolicy(initial_backoff_s=0.1, multiplier=2.0, max_backoff_s=10.0, jitter=0.5)
    draw = random.Random(7).random()
    assert policy.backoff_s(2, random.Random(7)) == pytest.approx(0.2 * (1.0 - 0.5 * draw))
    assert 0.1 <= policy.backoff_s(2) <= 0.2


def test_quarantine_doubles_within_its_bounds():
    policy = RetryPolicy(quarantine_s=0.5, max_quarantine_s=3.0)
    assert [policy.next_quarantine_s(p) for p in (0.0, 0.5, 1.0, 2.0)] == [0.5, 1.0, 2.0, 3.0]


def test_the_timer_runs_callbacks_in_due_order_and_survives_a_failing_one():
    order: list[str] = []
    done = threading.Event()

    def record(name: str):
        def run() -> None:
            order.append(name)
            if len(order) == 3:
                done.set()
        return run

    def fail() -> None:
        order.append("fail")
        raise RuntimeError("a failing callback")

    call_later(0.4, record("late"))
    call_later(-1.0, fail)
    call_later(0.1, record("soon"))
    assert done.wait(30), f"timer ran only {order}"
    assert order == ["fail", "soon", "late"]


def test_the_timer_is_one_daemon_thread_that_ends_when_idle():
    import time

    from coffea_sonic import retry

    scheduler = retry._schedulers.get("timer", retry._Scheduler)
    ran = threading.Event()
    call_later(0.3, ran.set)
    call_later(0.2, lambda: None)
    timers = [t for t in threading.enumerate() if t.name == "coffea-sonic-retry"]
    assert len(timers) == 1 and timers[0].daemon
    assert ran.wait(30)
    timers[0].join(timeout=60)  # idle for 5 s, it ends
    assert not timers[0].is_alive() and scheduler._thread is None
    scheduled = time.monotonic()
    ran.clear()
    call_later(1.5, ran.set)
    assert ran.wait(30) and time.monotonic() - scheduled >= 1.5  # never early


def test_a_callback_due_in_under_a_second_never_runs_early():
    import time

    ran_at: list[float] = []
    ran = threading.Event()
    scheduled = time.monotonic()
    call_later(0.8, lambda: (ran_at.append(time.monotonic()), ran.set()))
    assert ran.wait(30)
    assert ran_at[0] - scheduled >= 0.8


def test_an_idle_timer_that_finds_work_when_its_wait_ends_runs_it_instead_of_ending():
    from coffea_sonic import retry

    scheduler = retry._Scheduler(idle_s=0.3)
    first, second = threading.Event(), threading.Event()
    scheduler.call_later(0.0, first.set)
    assert first.wait(30)
    thread = scheduler._thread
    # work that arrives without a wake-up (as when it lands at the moment the idle wait times
    # out): the timer must see it when the wait ends, not end with it pending
    with scheduler._condition:
        while not scheduler._condition._waiters:  # the thread is in its idle wait
            scheduler._condition.wait(timeout=0.01)
        scheduler._heap.append((0.0, -1, second.set))
    assert second.wait(30), "the timer ended with a callback pending"
    thread.join(timeout=30)
    assert not thread.is_alive() and scheduler._thread is None
