"""How large a model's gRPC requests are and how many fly at once, from this process's share of
the server's work on that model (:class:`ShareSizer`).

How it works, with an example: docs/internals/dispatch.md.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .routing import Router
from .transport.errors import TransportError
from .transport.kinds import transport_kind

__all__ = ["ALONE", "ALONE_SHARE", "INTERVAL_S", "MAX_INTERVAL_S", "SHARED", "SHARED_SHARE", "Shape", "ShareSizer",
           "server_requests"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shape:
    """Bytes of tensors per request, and requests in flight."""

    max_request_bytes: int
    max_in_flight: int


#: The table's gRPC defaults: a server shared by many worker processes.
SHARED = Shape(transport_kind("grpc").max_request_bytes, transport_kind("grpc").max_in_flight)
#: This process is the server's only client of the model.
ALONE = Shape(2_359_296, 8)
#: Shares of the server's requests (this process's / all) that switch to ALONE and back.
ALONE_SHARE, SHARED_SHARE = 0.75, 0.5
#: Seconds between the first two reads of the server's statistics (a short job decides early),
#: and the longest gap later (a facility's hundreds of workers each read it that seldom).
INTERVAL_S, MAX_INTERVAL_S = 0.25, 8.0
#: Fewer requests than this in an interval say nothing about the share.
MIN_REQUESTS = 8


class ShareSizer:
    """The :class:`Shape` of one model's gRPC requests in this process.

    ``read_server_requests``: the requests the server(s) counted for the model so far (Triton's
    cumulative success count); ``clock``: seconds (monotonic).
    """

    def __init__(self, read_server_requests: Callable[[], int], *,
                 interval_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read_server_requests
        self._first_interval_s = INTERVAL_S if interval_s is None else interval_s
        self._interval_s = self._first_interval_s
        self._clock = clock
        self._current = SHARED
        self._reading = threading.Lock()
        self._last: tuple[int, int] | None = None  # (server's count, ours) at the last read
        self._next_read = -float("inf")
        self._readable = True

    def shape(self, answered: int = 0) -> Shape:
        """The shape of the next call's requests; ``answered``: the requests this process has
        had answered for the model so far."""
        now = self._clock()
        if now < self._next_read:
            return self._current
        if not self._reading.acquire(blocking=False):
            return self._current  # another thread reads now
        try:
            self._measure(now, answered)
        finally:
            self._reading.release()
        return self._current

    @property
    def alone(self) -> bool:
        """Whether this process was, at the last read, the server's only client of the model."""
        return self._current == ALONE

    def request_bytes(self, kind: str, max_in_flight: int | None, answered: int,
                      window: Any) -> int:
        """The default cap of a request's bytes over transport ``kind``: over gRPC, where the
        model gives no ``max_in_flight``, the current shape's, ``window`` resized to it."""
        if kind != "grpc" or max_in_flight is not None:
            return transport_kind(kind).max_request_bytes
        shape = self.shape(answered)
        window.resize(shape.max_in_flight)
        return shape.max_request_bytes

    def _measure(self, now: float, answered: int) -> None:
        try:
            counted = int(self._read())
        except Exception as error:  # noqa: BLE001 - restricted or unreachable: the defaults
            if self._readable:
                logger.info("coffea-sonic: the server's statistics are not readable (%s): gRPC "
                            "requests keep their default size", error)
            self._readable, self._current, self._last = False, SHARED, None
            self._interval_s = self._first_interval_s
            self._next_read = now + MAX_INTERVAL_S  # try again, seldom
            return
        self._readable = True
        self._next_read = now + self._interval_s
        if self._last is not None:
            counted_before, answered_before = self._last
            total, ours = counted - counted_before, answered - answered_before
            if total < MIN_REQUESTS:
                return  # the baseline stays: the next read covers a longer time
            switched = self._switch(ours / total)
            self._interval_s = (self._first_interval_s if switched
                                else min(2 * self._interval_s, MAX_INTERVAL_S))
            self._next_read = now + self._interval_s
        self._last = (counted, answered)

    def _switch(self, share: float) -> bool:
        if self._current == SHARED and share >= ALONE_SHARE:
            self._current = ALONE
        elif self._current == ALONE and share < SHARED_SHARE:
            self._current = SHARED
        else:
            return False
        logger.debug("coffea-sonic: this process sent %.0f %% of the server's requests: gRPC "
                     "requests of %d bytes, %d in flight", 100 * min(share, 1.0),
                     self._current.max_request_bytes, self._current.max_in_flight)
        return True


def server_requests(router: Router, model: str, version: str, timeout_s: float) -> int:
    """Requests the reachable servers of ``router`` counted for ``model`` so far."""
    total, read = 0, False
    for endpoint in router.endpoints:
        if endpoint.healthy:
            # one small call, in the caller's thread: bounded well below a request's timeout
            total += router.control(endpoint).statistics(model, version,
                                                         min(timeout_s, 1.0)).success_count
            read = True
    if not read:
        raise TransportError("down", "no reachable server to read statistics from")
    return total
