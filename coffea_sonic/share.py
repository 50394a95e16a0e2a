"""A bulk user that yields to the others on a shared server (:class:`YieldGate`).

Why and how, with a usage and an example: docs/internals/client.md.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from .errors import ConfigurationError

logger = logging.getLogger(__name__)

__all__ = ["YieldGate"]


class YieldGate:
    """Caps one client's rows/s at ``share`` times the other users' rows/s on the same model.

    ``statistics``: anything with ``server_statistics()`` returning an object with a cumulative
    ``inference_count`` (a :class:`~coffea_sonic.model.TritonModel` of the shared model; use one
    that sends no inference requests of its own). ``floor_rows_per_s``: the cap never goes below
    this, so the bulk user is never stopped. ``start=False``: no polling thread (:meth:`update`
    is then called by hand). ``clock`` and ``sleep``: the monotonic clock the cap's arithmetic
    runs on and how :meth:`acquire` waits on it (``time.monotonic`` and ``time.sleep``; a test
    passes a clock of its own).
    """

    def __init__(self, statistics: Any, share: float, *, burst_rows: int, poll_s: float = 0.25,
                 floor_rows_per_s: float = 0.0, start: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if share <= 0 or burst_rows < 1 or poll_s <= 0:
            raise ConfigurationError(
                f"YieldGate needs share > 0, burst_rows >= 1 and poll_s > 0, not {share!r}, "
                f"{burst_rows!r}, {poll_s!r}")
        self.statistics, self.share, self.poll_s = statistics, share, poll_s
        self.burst_rows, self.floor = burst_rows, floor_rows_per_s
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._cap: float | None = None
        self._own_rows = 0
        self._last: tuple[int, int, float] | None = None  # (total, own, when) of the last poll
        self._tokens = float(burst_rows)
        self._filled_at = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._poll, daemon=True, name="yield-gate")
            self._thread.start()

    @property
    def cap_rows_per_s(self) -> float | None:
        """The current cap (rows/s), None while nobody else is served."""
        return self._cap

    def answered(self, rows: int) -> None:
        """Count ``rows`` this client got answered (so that they are not taken for others')."""
        with self._lock:
            self._own_rows += rows

    def update(self, total_rows: int | None, now: float | None = None) -> None:
        """Take a new snapshot of the server's rows (None: no statistics, so no cap)."""
        now = self._clock() if now is None else now
        with self._lock:
            self._fill(now)
            if total_rows is None:
                self._cap, self._last = None, None
                return
            if self._last is not None and now > self._last[2]:
                total, own, when = self._last
                others = max(0, (total_rows - total) - (self._own_rows - own)) / (now - when)
                self._cap = max(self.floor, self.share * others) if others > 0 else None
            self._last = (total_rows, self._own_rows, now)

    def acquire(self, rows: int, deadline: float | None = None) -> bool:
        """Wait until ``rows`` may be sent under the cap; False if ``deadline`` (on the gate's
        clock, ``time.monotonic`` by default) came first (nothing taken)."""
        while True:
            with self._lock:
                now = self._clock()
                self._fill(now)
                if self._cap is None:
                    return True
                if self._tokens >= min(rows, self.burst_rows):
                    self._tokens -= rows
                    return True
                wait = (min(rows, self.burst_rows) - self._tokens) / max(self._cap, 1.0)
            if deadline is not None and now + min(wait, self.poll_s) >= deadline:
                self._sleep(max(0.0, deadline - now))
                return False
            self._sleep(min(wait, self.poll_s))

    def _fill(self, now: float) -> None:
        if self._cap is None:
            self._tokens = float(self.burst_rows)
        else:
            self._tokens = min(float(self.burst_rows),
                               self._tokens + self._cap * (now - self._filled_at))
        self._filled_at = now

    def _poll(self) -> None:
        warned = False
        while True:
            try:
                total: int | None = int(self.statistics.server_statistics().inference_count)
            except Exception as error:  # noqa: BLE001 - no statistics: no cap, keep trying
                if not warned:
                    logger.warning("yield gate: no server statistics, no cap: %s", error)
                    warned = True
                total = None
            self.update(total)
            if self._stop.wait(self.poll_s):
                return

    def close(self) -> None:
        """Stop polling (the cap stays as it was)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> "YieldGate":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
