"""How hard a request is tried (:class:`RetryPolicy`) and when a retry runs (:func:`call_later`).

How retries are decided, with examples: docs/internals/dispatch.md.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from .core.process_local import ProcessLocal
from .errors import ConfigurationError

__all__ = ["RetryPolicy", "call_later"]

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

    def next_quarantine_s(self, previous_s: float) -> float:
        """A failed server's next quarantine: doubled from ``previous_s`` (0: none yet), within
        ``quarantine_s`` and ``max_quarantine_s``."""
        return min(self.max_quarantine_s, max(self.quarantine_s, previous_s * 2))


# -- a per-process timer for retries (one thread, not one per retry) ---------------------------------

class _Scheduler:
    def __init__(self, idle_s: float = 5.0) -> None:
        #: how long the thread waits with nothing scheduled before it ends
        self.idle_s = idle_s
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
                        if not self._condition.wait(timeout=self.idle_s) and not self._heap:
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


#: this process' timer (a forked child starts its own; the parent's is never joined there)
_schedulers: ProcessLocal[str, _Scheduler] = ProcessLocal("retry timer")


def call_later(delay_s: float, function: Callable[[], None]) -> None:
    """Run ``function`` in this process's retry thread after ``delay_s`` seconds."""
    _schedulers.get("timer", _Scheduler).call_later(delay_s, function)
