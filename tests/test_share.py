"""``YieldGate``: a bulk user's cap at a share of the other users' rows/s, from the server's
statistics. The cap's arithmetic runs on a clock the tests move (``clock=``/``sleep=``), fed the
server's row counts directly, so nothing here depends on how fast the machine is; one test keeps
the real clock, for the deadline."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from coffea_sonic.errors import ConfigurationError
from coffea_sonic.share import YieldGate
from helpers import wait_for


class _Clock:
    """A monotonic clock that moves only when told to: ``sleep`` moves it at once."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        with self._lock:
            self.now += seconds


def _capped_gate(clock: _Clock, cap: float, burst_rows: int) -> YieldGate:
    """A gate (no polling thread) whose cap is ``cap`` rows/s: the others got ``cap / share``
    rows in one second of ``clock``."""
    gate = YieldGate(None, share=0.5, burst_rows=burst_rows, start=False, clock=clock,
                     sleep=clock.sleep)
    gate.update(0)
    clock.sleep(1.0)
    gate.update(int(cap / 0.5))
    assert gate.cap_rows_per_s == cap
    return gate


def test_the_cap_is_the_share_of_the_others_rows_per_second():
    gate = YieldGate(None, share=0.25, burst_rows=1000, start=False)
    assert gate.cap_rows_per_s is None  # one snapshot is no rate yet
    gate.update(0, now=0.0)
    assert gate.cap_rows_per_s is None
    gate.update(100_000, now=2.0)  # the others: 50 k rows/s
    assert gate.cap_rows_per_s == 12_500
    gate.update(400_000, now=3.0)  # they speed up to 300 k rows/s: the cap follows
    assert gate.cap_rows_per_s == 75_000


def test_its_own_answered_rows_are_not_taken_for_the_others():
    gate = YieldGate(None, share=0.25, burst_rows=1000, start=False)
    gate.update(0, now=0.0)
    gate.answered(30_000)
    gate.update(50_000, now=1.0)  # 50 k rows answered, 30 k of them its own
    assert gate.cap_rows_per_s == 5_000
    gate.answered(40_000)
    gate.update(90_000, now=2.0)  # every row since was its own: nobody else served, no cap
    assert gate.cap_rows_per_s is None


def test_the_cap_never_goes_below_the_floor():
    gate = YieldGate(None, share=0.5, burst_rows=1000, floor_rows_per_s=8_000, start=False)
    gate.update(0, now=0.0)
    gate.update(1_000, now=1.0)  # half of 1 k rows/s is below the floor
    assert gate.cap_rows_per_s == 8_000
    gate.update(101_000, now=2.0)
    assert gate.cap_rows_per_s == 50_000


def test_no_cap_while_nobody_else_is_served_or_without_statistics():
    gate = YieldGate(None, share=0.5, burst_rows=1000, start=False)
    gate.update(0, now=0.0)
    gate.update(10_000, now=1.0)
    assert gate.cap_rows_per_s == 5_000
    gate.update(10_000, now=2.0)  # nobody else served
    assert gate.cap_rows_per_s is None
    gate.update(20_000, now=3.0)
    assert gate.cap_rows_per_s == 5_000
    gate.update(None, now=4.0)  # the statistics went away
    assert gate.cap_rows_per_s is None
    # back: one snapshot is no rate, the next one is; a snapshot at the same moment changes nothing
    gate.update(50_000, now=5.0)
    assert gate.cap_rows_per_s is None
    gate.update(50_000, now=5.0)
    assert gate.cap_rows_per_s is None
    gate.update(54_000, now=6.0)
    assert gate.cap_rows_per_s == 2_000


def test_rows_go_out_at_the_cap_after_a_burst():
    clock = _Clock()
    gate = _capped_gate(clock, cap=10_000, burst_rows=1000)
    started = clock()
    assert gate.acquire(1000) and clock() == started  # the burst: at once
    for _ in range(49):
        assert gate.acquire(1000)
    # 49 k rows after the burst at 10 k rows/s
    assert clock() - started == pytest.approx(4.9)


def test_requests_larger_than_the_burst_still_average_the_cap():
    clock = _Clock()
    gate = _capped_gate(clock, cap=10_000, burst_rows=1000)
    started = clock()
    for _ in range(10):
        assert gate.acquire(5000)  # each goes out once a burst's worth is back, owing the rest
    # the first at once, each next one once the previous one's 5 k rows are paid back
    assert clock() - started == pytest.approx(9 * 0.5)


def test_no_cap_sends_at_once():
    clock = _Clock()
    gate = YieldGate(None, share=0.5, burst_rows=1000, start=False, clock=clock,
                     sleep=clock.sleep)
    started = clock()
    for _ in range(100):
        assert gate.acquire(1000)
    assert clock() == started


def test_acquire_gives_up_at_its_deadline_and_takes_nothing():
    clock = _Clock()
    gate = _capped_gate(clock, cap=10, burst_rows=100)
    started = clock()
    assert gate.acquire(100)  # the burst
    assert not gate.acquire(100, deadline=started + 0.2)
    assert clock() == pytest.approx(started + 0.2)
    # the refused call took nothing: the next 100 rows go out 10 s after the burst
    assert gate.acquire(100)
    assert clock() == pytest.approx(started + 10.0)


def test_acquire_on_the_real_clock_returns_false_no_earlier_than_its_deadline():
    gate = YieldGate(None, share=0.5, burst_rows=100, start=False)
    now = time.monotonic()
    gate.update(0, now=now - 1.0)
    gate.update(20, now=now)  # others: 20 rows/s, so the cap is 10 rows/s
    assert gate.acquire(100)  # the burst
    deadline = time.monotonic() + 0.2
    assert not gate.acquire(100, deadline=deadline)
    assert time.monotonic() >= deadline


@dataclass
class _Snapshot:
    inference_count: int


class _Statistics:
    """A server's statistics for the polling thread: each read is one second later on ``clock``
    and the others have ``others_per_read`` more rows answered; ``fail``: the read raises."""

    def __init__(self, clock: _Clock, others_per_read: int) -> None:
        self.clock, self.others_per_read = clock, others_per_read
        self.count, self.fail = 0, False

    def server_statistics(self) -> _Snapshot:
        if self.fail:
            raise ConnectionError("statistics are down")
        self.clock.sleep(1.0)
        self.count += self.others_per_read
        return _Snapshot(self.count)


def test_the_polling_thread_follows_the_servers_statistics():
    clock = _Clock()
    statistics = _Statistics(clock, others_per_read=4_000)
    with YieldGate(statistics, share=0.25, burst_rows=1000, poll_s=0.01, clock=clock,
                   sleep=clock.sleep) as gate:
        wait_for(lambda: gate.cap_rows_per_s == 1_000, timeout=30,
                 what=lambda: f"a cap of 1000 rows/s, not {gate.cap_rows_per_s}")
        statistics.others_per_read = 0  # nobody else served any more
        wait_for(lambda: gate.cap_rows_per_s is None, timeout=30,
                 what=lambda: f"no cap while nobody else is served, not {gate.cap_rows_per_s}")
        statistics.others_per_read = 8_000
        wait_for(lambda: gate.cap_rows_per_s == 2_000, timeout=30,
                 what=lambda: f"a cap of 2000 rows/s, not {gate.cap_rows_per_s}")
        statistics.fail = True  # the statistics go away while the others are still served
        wait_for(lambda: gate.cap_rows_per_s is None, timeout=30,
                 what=lambda: f"no cap without statistics, not {gate.cap_rows_per_s}")
    assert gate._thread is not None and not gate._thread.is_alive()


@pytest.mark.parametrize("arguments", [{"share": 0}, {"share": -0.5}, {"burst_rows": 0},
                                       {"poll_s": 0}])
def test_bad_arguments(arguments):
    settings = {"share": 0.5, "burst_rows": 1, "poll_s": 0.25, **arguments}
    with pytest.raises(ConfigurationError, match="share > 0"):
        YieldGate(None, start=False, **settings)
