"""``YieldGate``: a bulk user's cap at a share of the other users' rows/s, from the server's
statistics (no server needed: a fake statistics source counts rows as time passes)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from coffea_sonic.errors import ConfigurationError

from coffea_sonic.share import YieldGate
from helpers import wait_for


@dataclass
class _Snapshot:
    inference_count: int


class _FakeServer:
    """The others get ``others_rows_per_s``; this user's answered rows are added by the test."""

    def __init__(self, others_rows_per_s: float) -> None:
        self.started = time.monotonic()
        self.others_rows_per_s = others_rows_per_s
        self.own = 0
        self.fail = False

    def server_statistics(self) -> _Snapshot:
        if self.fail:
            raise ConnectionError("statistics are down")
        others = (time.monotonic() - self.started) * self.others_rows_per_s
        return _Snapshot(inference_count=int(others) + self.own)


def _rate(gate: YieldGate, server: _FakeServer, rows: int, seconds: float) -> float:
    started, sent = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        assert gate.acquire(rows)
        sent += rows
        server.own += rows
        gate.answered(rows)
    return sent / (time.monotonic() - started)


def test_the_cap_follows_the_others_rows():
    server = _FakeServer(others_rows_per_s=400_000)
    with YieldGate(server, share=0.25, burst_rows=1000, poll_s=0.05) as gate:
        time.sleep(0.2)
        assert gate.cap_rows_per_s == pytest.approx(100_000, rel=0.2)
        # its own rows are not taken for the others': the cap stays at a quarter of theirs
        assert _rate(gate, server, 1000, 1.0) == pytest.approx(100_000, rel=0.25)
        assert gate.cap_rows_per_s == pytest.approx(100_000, rel=0.2)


def test_no_cap_while_nobody_else_is_served_or_without_statistics():
    server = _FakeServer(others_rows_per_s=50_000)
    with YieldGate(server, share=0.25, burst_rows=1000, poll_s=0.05) as gate:
        # a cap while the others are served, so that each "no cap" below is a change
        wait_for(lambda: gate.cap_rows_per_s is not None, timeout=10, what="a cap")
        server.others_rows_per_s = 0  # nobody else served any more
        wait_for(lambda: gate.cap_rows_per_s is None, timeout=10,
                 what=lambda: f"no cap while nobody else is served, not {gate.cap_rows_per_s}")
        assert _rate(gate, server, 1000, 0.2) > 1_000_000
        server.others_rows_per_s = 50_000
        wait_for(lambda: gate.cap_rows_per_s is not None, timeout=10, what="a cap again")
        server.fail = True  # the statistics go away while the others are still served
        wait_for(lambda: gate.cap_rows_per_s is None, timeout=10,
                 what=lambda: f"no cap without statistics, not {gate.cap_rows_per_s}")
        assert _rate(gate, server, 1000, 0.2) > 1_000_000


def test_acquire_gives_up_at_its_deadline():
    gate = YieldGate(None, share=0.5, burst_rows=100, start=False)
    gate.update(0, now=0.0)
    gate.update(20, now=1.0)  # others: 20 rows/s, so the cap is 10 rows/s
    assert gate.acquire(100)  # the burst
    started = time.monotonic()
    assert not gate.acquire(100, deadline=started + 0.2)
    assert 0.15 < time.monotonic() - started < 1.0


def test_bad_arguments():
    with pytest.raises(ConfigurationError, match="share > 0"):
        YieldGate(None, share=0, burst_rows=1, start=False)
