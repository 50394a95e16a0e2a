"""The user processes of the fairness scenario (:mod:`coffea_sonic.bench.fairness`).

Each user is its own process with its own ``TritonModel`` clients, as separate analyses sharing a
server are. A user sends its requests through *lanes*: lane ``k`` is one client with one request in
flight at a time, so a user with ``w`` lanes keeps up to ``w`` requests in flight. Under the
``fair`` policy lane ``k`` sends at priority ``k + 1``: every user's first request in flight is at
level 1, its second at level 2, and so on, so Triton's batcher, serving the lowest level first,
serves the users' requests round robin by depth, and a user with ten times the lanes gets its extra
requests served only when nobody else's are waiting. Under ``fifo`` no priority is sent.

A phase tells each user what to do from ``start_at`` (``time.monotonic()``, the same clock in every
process) for ``duration_s`` seconds:

* ``idle``: nothing;
* ``paced``: an open loop, one request every ``interval_s / load`` on average (each interval
  jittered by +-50 %, so users do not send in lock step), on the lowest free lane, or as soon as a
  lane is free if all are busy: a light user (``load`` 1) sends below its fair share, the heavy
  one (``load`` 10) ten times as much;
* ``saturate``: every lane sends its next request as soon as its previous one is answered (a
  closed loop with a full window): a user that takes whatever the server gives it.

A request counts only when its answer has every row and equals the answer the user got during
warm-up for the same rows (the model is deterministic).

A user with ``nice`` > 0 lowers its own CPU priority before it starts (``os.nice``), as a batch
system runs a bulk job: its client then takes the cores only when the interactive users' clients
and the server leave them idle. A user with ``yield_share`` > 0 asks a
:class:`~coffea_sonic.share.YieldGate` before each request: while the others are served it sends
at most that share of the rows/s they get together; what it wanted beyond that in a phase is not
sent (a paced user falls behind its schedule, a saturating one waits).

>>> spec = UserSpec(index=0, url="triton+grpc://127.0.0.1:1/jet_tagger", lanes=5, rows=64,
...                 levels=3)
>>> [lane_priority(spec, lane, "fair") for lane in range(5)], lane_priority(spec, 0, "fifo")
([1, 2, 3, 3, 3], None)
"""

from __future__ import annotations

import logging
import os
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..share import YieldGate

logger = logging.getLogger(__name__)

#: Policies the scenario knows: priorities by depth (``fair``), none (``fifo``), or a quota per
#: user at the facility's gateway (``gateway``, :mod:`coffea_sonic.bench.fairness_gateway`).
POLICIES: tuple[str, ...] = ("fair", "fifo", "gateway")
#: What a user does in a phase.
MODES: tuple[str, ...] = ("idle", "paced", "saturate")


@dataclass(frozen=True)
class UserSpec:
    """One user: which server, how many lanes (requests in flight at most), rows per request."""

    index: int
    url: str
    lanes: int
    rows: int
    model: str = "jet_tagger"
    policy: str = "fair"
    #: the server's priority levels: lane k sends at min(k + 1, levels)
    levels: int = 1
    #: load when paced, in multiples of a light user's (one request every interval_s / load)
    load: float = 1.0
    warmup_requests: int = 3
    timeout_s: float = 60.0
    #: niceness the user's process adds to itself before it starts (``os.nice``): 0 for an
    #: interactive analysis, up to 19 (the lowest CPU priority) for a bulk job, as a batch system
    #: runs one
    nice: int = 0
    #: > 0: while other users are served, this user sends at most this share of the rows/s they
    #: get together (:class:`coffea_sonic.share.YieldGate`), waiting before it sends
    yield_share: float = 0.0
    #: a file holding this user's bearer token (policy ``gateway``: each user its own subject)
    token_file: str = ""


@dataclass(frozen=True)
class Phase:
    """What every user does between ``start_at`` and ``start_at + duration_s`` (monotonic)."""

    name: str
    start_at: float
    duration_s: float
    modes: tuple[str, ...]
    interval_s: float = 0.02


def lane_priority(spec: UserSpec, lane: int, policy: str) -> int | None:
    """Priority level of ``lane``'s requests under ``fair``: ``lane + 1``, and the last level
    (``spec.levels``) for every lane beyond; None (the model's default) otherwise."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
    return min(lane + 1, spec.levels) if policy == "fair" else None


class _User:
    """The lanes of one user and what they measured (runs inside the user's process)."""

    def __init__(self, spec: UserSpec) -> None:
        from ..model import TritonModel

        self.spec = spec
        generator = np.random.default_rng(1000 + spec.index)
        self.inputs = {"features": generator.normal(size=(spec.rows, 6)).astype(np.float32)}
        from ..core.secrets import Secret

        retry = {"max_attempts": 20, "total_s": 120.0, "initial_backoff_s": 0.01,
                 "max_backoff_s": 0.5}
        headers = ({"authorization": Secret.from_file(spec.token_file, prefix="Bearer ")}
                   if spec.token_file else None)
        self.lanes = [TritonModel(spec.url, transport="grpc", max_in_flight=1, retry=retry,
                                  timeout_s=spec.timeout_s, headers=headers,
                                  priority=lane_priority(spec, lane, spec.policy))
                      for lane in range(spec.lanes)]
        self.expected: np.ndarray | None = None
        self.gate: YieldGate | None = None
        if spec.yield_share > 0:
            # its own client for the statistics, so that they never wait behind a lane's request
            self.gate = YieldGate(TritonModel(spec.url, transport="grpc"), spec.yield_share,
                                  burst_rows=spec.rows)

    def warm_up(self) -> None:
        for lane in self.lanes:
            for _ in range(self.spec.warmup_requests):
                answer = lane(self.inputs)["probs"]
                if self.expected is None:
                    self.expected = np.array(answer)
                elif not np.array_equal(answer, self.expected):
                    raise AssertionError(f"user {self.spec.index}: the server answered the same "
                                         "rows differently during warm-up")

    def _send(self, lane: int) -> tuple[float, float, int, bool]:
        """One request on ``lane``: ``(sent, answered, rows, good)``."""
        sent = time.monotonic()
        try:
            answer = self.lanes[lane](self.inputs)["probs"]
            good = answer.shape[0] == self.spec.rows and np.array_equal(answer, self.expected)
            if self.gate is not None:
                self.gate.answered(answer.shape[0])
        except Exception as error:  # noqa: BLE001 - a failed request is counted, not fatal
            logger.warning("user %d lane %d: request failed: %s", self.spec.index, lane, error)
            good = False
        return sent, time.monotonic(), self.spec.rows, good

    def rejected(self) -> int:
        """Requests of this user the server refused so far (overload), each retried later."""
        return sum(lane.stats.failed_requests for lane in self.lanes)

    def run(self, phase: Phase) -> list[tuple[float, float, int, bool, int]]:
        """Run ``phase``; ``[(sent, answered, rows, good, lane)]`` of every request sent in it."""
        mode = phase.modes[self.spec.index]
        records: list[tuple[float, float, int, bool, int]] = []
        lock = threading.Lock()
        end = phase.start_at + phase.duration_s
        wait = phase.start_at - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if mode == "idle":
            time.sleep(max(0.0, end - time.monotonic()))
            return records
        if mode == "paced":
            self._paced(phase, records, lock)
            return records

        def closed_loop(lane: int) -> None:
            while time.monotonic() < end:
                if self.gate is not None and not self.gate.acquire(self.spec.rows, deadline=end):
                    break
                record = self._send(lane)
                with lock:
                    records.append((*record, lane))

        self._join([self._thread(closed_loop, lane) for lane in range(len(self.lanes))], phase)
        return records

    def _thread(self, target: Any, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True,
                                  name=f"user{self.spec.index}-{getattr(target, '__name__', '')}")
        thread.start()
        return thread

    def _join(self, threads: list[threading.Thread], phase: Phase) -> None:
        for thread in threads:
            thread.join(timeout=phase.duration_s + 2 * self.spec.timeout_s)
        if any(thread.is_alive() for thread in threads):
            raise RuntimeError(f"user {self.spec.index}: a lane is still running after the phase")

    def _paced(self, phase: Phase, records: list, lock: threading.Lock) -> None:
        """Open loop at ``spec.load / interval_s`` requests/s (intervals jittered +-50 %): each
        request goes out on time on the lowest free lane (so its priority is its depth), or, if
        every lane is busy, as soon as one is free."""
        end = phase.start_at + phase.duration_s
        jitter = random.Random(self.spec.index * 7919 + int(phase.start_at))
        interval = phase.interval_s / self.spec.load
        # one inbox per lane, so that a request wakes only its lane's thread: one condition
        # shared by the heavy user's 20 lanes woke all of them for every request and answer
        # (thousands of wake-ups a second, each taking the GIL and a core from the others)
        inboxes: list[queue.SimpleQueue[bool]] = [queue.SimpleQueue() for _ in self.lanes]
        free = threading.Condition()
        busy = [False] * len(self.lanes)

        def lane_worker(lane: int) -> None:
            while inboxes[lane].get():
                record = self._send(lane)
                with lock:
                    records.append((*record, lane))
                with free:
                    busy[lane] = False
                    free.notify()

        workers = [self._thread(lane_worker, lane) for lane in range(len(self.lanes))]
        next_at = phase.start_at + jitter.uniform(0, interval)
        try:
            while next_at < end:
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                # asked before a lane is chosen, so that the request goes on the lowest free lane
                # (its priority stays its depth); held back until the phase ends, what the user
                # wanted beyond its share is not sent
                if self.gate is not None and not self.gate.acquire(self.spec.rows, deadline=end):
                    break
                with free:
                    free.wait_for(lambda: not all(busy))
                    lane = busy.index(False)
                    busy[lane] = True
                inboxes[lane].put(True)
                next_at += interval * jitter.uniform(0.5, 1.5)
        finally:
            for inbox in inboxes:
                inbox.put(False)
            self._join(workers, phase)


def user_main(spec: UserSpec, commands: Any, results: Any) -> None:
    """Entry point of a user process: warm up, then run each phase sent on ``commands``
    (``None`` ends the process) and put ``(index, phase name, {"records": [...], "rejected":
    requests the server refused and the client sent again})`` on ``results``;
    a failure is put as ``(index, "error", message)``."""
    logging.basicConfig(level=logging.WARNING)
    try:
        if spec.nice:
            os.nice(spec.nice)
        user = _User(spec)
        user.warm_up()
        results.put((spec.index, "ready", []))
        while True:
            phase = commands.get()
            if phase is None:
                if user.gate is not None:
                    user.gate.close()  # stop its polling thread before the process ends
                return
            before = user.rejected()
            records = user.run(phase)
            results.put((spec.index, phase.name, {"records": records,
                                                  "rejected": user.rejected() - before}))
    except BaseException as error:  # noqa: BLE001 - reported to the coordinator
        results.put((spec.index, "error", f"{type(error).__name__}: {error}"))
