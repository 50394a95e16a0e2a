"""A lone caller's call over the wire starts and ends with small requests (:func:`ramped`,
:class:`TailHold`). Why and how: docs/internals/dispatch.md.

>>> ramped([(0, 100)], row_bytes=64)   # one request: nothing to overlap
[(0, 100)]
"""

from __future__ import annotations

import threading

__all__ = ["FIRST_BYTES", "HOLD_TURNAROUND_S", "MAX_RETRY_CALLS", "RETRY_CALLS", "TailHold",
           "ramped", "tail_start"]

#: Bytes of the first (and last) request of a ramped call: encoded in well under 1 ms here, and
#: above the size where a request's fixed cost outweighs its bytes on a 1 Gb/s link.
FIRST_BYTES = 256 * 1024
#: A held last request answered within this (sent to answered) says the round trip is short, and
#: holding costs the link less than the server's work on a large last request. At 1 Gb/s on the
#: 2-core box the last held request comes back 2-3 ms after it was sent, after 20 ms or more with
#: 20 ms added to the round trip.
HOLD_TURNAROUND_S = 0.010
#: Calls between two tries of holding after a held call came back late; doubled after each try
#: that comes back late too, up to :data:`MAX_RETRY_CALLS`.
RETRY_CALLS = 32
#: At most this many calls between two tries (a minute of 12.8 MB calls at 1 Gb/s and 20 ms).
MAX_RETRY_CALLS = 512


def _doubling(rows: int, first: int) -> list[int]:
    """Piece sizes ``first, 2 first, 4 first, ...`` covering ``rows`` (the last takes the rest)."""
    sizes, size = [], first
    while rows > 0:
        if rows - size < size:  # the rest would be smaller than this piece: take it all
            size = rows
        sizes.append(size)
        rows -= size
        size *= 2
    return sizes


def ramped(plan: list[tuple[int, int]], row_bytes: int,
           first_bytes: int = FIRST_BYTES) -> list[tuple[int, int]]:
    """``plan`` (row spans ``(start, stop)``, one per request, in order) with its first span cut
    into doubling pieces from ``first_bytes`` and its last into halving pieces down to it; a plan
    of one span, or spans already this small, stays as it is."""
    if len(plan) < 2:
        return list(plan)
    first_rows = max(1, first_bytes // max(1, row_bytes))
    (start, stop), (last_start, last_stop) = plan[0], plan[-1]
    if stop - start < 2 * first_rows or last_stop - last_start < 2 * first_rows:
        return list(plan)
    head, position = [], start
    for size in _doubling(stop - start, first_rows):
        head.append((position, position + size))
        position += size
    tail, position = [], last_stop
    for size in _doubling(last_stop - last_start, first_rows):
        tail.append((position - size, position))
        position -= size
    return head + list(plan[1:-1]) + tail[::-1]


def tail_start(plan: list[tuple[int, int]], last_start: int) -> int:
    """Index in a ramped ``plan`` of the first piece cut from the last request (whose rows begin
    at ``last_start``); ``len(plan)`` if none is.

    >>> tail_start([(0, 128), (128, 384), (384, 1000), (1000, 1616), (1616, 1872), (1872, 2000)],
    ...            1000)
    3
    """
    return next((i for i, (start, _) in enumerate(plan) if start >= last_start), len(plan))


class TailHold:
    """Whether a lone waiting caller's next ramped call holds its last requests back.

    >>> hold = TailHold()
    >>> hold.next_call()  # the first call tries
    True
    >>> hold.answered(0.025)  # its last request took 25 ms: a long round trip
    >>> [hold.next_call() for _ in range(RETRY_CALLS)].count(True)  # tried again once
    1
    >>> hold.answered(0.025)  # late again: the next try waits twice as long
    >>> [hold.next_call() for _ in range(2 * RETRY_CALLS)].index(True) + 1
    64
    >>> hold.answered(0.004)  # short: every call holds again
    >>> hold.next_call()
    True
    """

    def __init__(self) -> None:
        self._holding = True
        self._calls_since = 0
        self._interval = RETRY_CALLS
        self._lock = threading.Lock()

    def next_call(self) -> bool:
        """Whether the call being sent now holds its last requests."""
        with self._lock:
            if self._holding:
                return True
            self._calls_since += 1
            if self._calls_since < self._interval:
                return False
            self._calls_since = 0
            return True

    def answered(self, turnaround_s: float) -> None:
        """A held call's last request came back ``turnaround_s`` after it was sent."""
        with self._lock:
            short = turnaround_s < HOLD_TURNAROUND_S
            if short:
                self._interval = RETRY_CALLS
            elif not self._holding:  # a try came back late
                self._interval = min(2 * self._interval, MAX_RETRY_CALLS)
            self._holding = short
            self._calls_since = 0
