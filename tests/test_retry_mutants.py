"""The retry timer's loop run in the test's own thread, and the policy's full messages: in-process.

``_Scheduler._run`` normally runs in the timer thread; here it runs in the calling thread with a
short idle time (it returns once idle), so what it does to each callback is seen directly.
"""
from __future__ import annotations

import logging
import threading
import time

import pytest

from coffea_sonic import retry
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.retry import RetryPolicy


def _loop(idle_s: float = 0.05) -> retry._Scheduler:
    return retry._Scheduler(idle_s=idle_s)


def _push(scheduler: retry._Scheduler, due: float, function) -> None:
    with scheduler._condition:
        scheduler._heap.append((due, len(scheduler._heap), function))


def test_a_bad_time_budget_or_backoff_is_refused_with_the_whole_rule():
    for options in (dict(total_s=0.0), dict(initial_backoff_s=-1.0), dict(quarantine_s=-1.0)):
        with pytest.raises(ConfigurationError,
                           match="^total_s and quarantine_s must be > 0, backoff >= 0$"):
            RetryPolicy(**options)


def test_the_timer_thread_lingers_five_seconds_idle_before_it_ends():
    assert retry._Scheduler().idle_s == 5.0


def test_the_loop_never_runs_a_callback_before_it_is_due():
    scheduler = _loop()
    ran_at: list[float] = []
    due = time.monotonic() + 0.5
    _push(scheduler, due, lambda: ran_at.append(time.monotonic()))
    scheduler._run()
    assert len(ran_at) == 1 and ran_at[0] >= due


def test_a_failing_callback_is_logged_with_its_traceback_and_the_loop_goes_on(caplog):
    scheduler = _loop()
    after: list[str] = []

    def fail() -> None:
        raise RuntimeError("the retry could not be sent")

    _push(scheduler, 0.0, fail)
    _push(scheduler, 0.0, lambda: after.append("next"))
    with caplog.at_level(logging.ERROR, logger="coffea_sonic.retry"):
        scheduler._run()
    assert after == ["next"]
    assert [r.getMessage() for r in caplog.records] == ["coffea-sonic: scheduled retry failed"]
    assert caplog.records[0].exc_info[1].args == ("the retry could not be sent",)


def _when_idle(scheduler: retry._Scheduler, then) -> None:
    with scheduler._condition:
        while not scheduler._condition._waiters:  # the loop is in its idle wait
            scheduler._condition.wait(timeout=0.01)
        then()
        scheduler._condition.notify()


def test_work_that_wakes_an_idle_loop_runs_once_and_nothing_earlier_runs_again():
    scheduler = _loop(idle_s=30.0)
    runs: list[str] = []
    first, second = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def wake_twice() -> None:
        try:
            assert first.wait(30), "the first callback never ran"
            _when_idle(scheduler, lambda: _push(scheduler, 0.0, lambda: (runs.append("second"),
                                                                         second.set())))
            assert second.wait(30), "the callback that woke the loop never ran"
            _when_idle(scheduler, lambda: setattr(scheduler, "idle_s", 0.01))  # now end
        except BaseException as error:  # re-raised below
            errors.append(error)

    _push(scheduler, 0.0, lambda: (runs.append("first"), first.set()))
    helper = threading.Thread(target=wake_twice)
    helper.start()
    scheduler._run()
    helper.join(60)
    if errors:
        raise errors[0]
    assert not helper.is_alive() and runs == ["first", "second"]
