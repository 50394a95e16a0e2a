"""``coffea-sonic bench fairness``: several users share one server; is it fair?
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .clients import ClientPool, ready_then_start
from .probes import percentile

logger = logging.getLogger(__name__)

__all__ = ["FairnessConfig", "GOALS", "PRESETS", "Phase", "UserSpec", "config_for", "jain",
           "lane_priority", "run_fairness", "user_task"]

#: Jain's index of goodput, the light users' p95 ratio, the heavy user at most 2 fair shares
GOALS: dict[str, tuple[str, float]] = {"jain": (">=", 0.9), "light_p95_ratio": ("<=", 1.5),
                                       "heavy_share_of_goodput": ("<=", 2 / 8)}
POLICIES: tuple[str, ...] = ("fair", "fifo", "gateway")
MODEL = "jet_tagger"


@dataclass(frozen=True)
class FairnessConfig:
    """Shape and length of the scenario (docs/internals/bench.md)."""

    users: int = 8
    heavy_factor: int = 10
    light_lanes: int = 2
    rows: int = 8192
    interval_s: float = 0.16
    rounds: int = 4
    solo_s: float = 8.0
    contended_s: float = 10.0
    saturate_s: float = 20.0
    settle_s: float = 1.0
    policy: str = "fair"
    instances: int = 2
    heavy_nice: int = 5  # 19 starved its client while all saturate (Jain 0.89)
    concurrent_executions: int = 0  # Triton's rate limiter; 0: one per instance
    overflow_queue: int = 2
    heavy_yield_share: float = 0.2
    #: policy gateway: each user's quota in light users' paced rates, and the retry-after asked
    gateway_quota_factor: float = 1.6
    gateway_retry_after_s: float = 0.2
    preset: str = "full"

    heavy_lanes = property(lambda self: self.heavy_factor * self.light_lanes)
    levels = property(lambda self: self.light_lanes + 1)

    def check(self) -> None:
        from ..errors import ConfigurationError

        if (min(self.light_lanes, self.heavy_factor, self.rows, self.rounds) < 1
                or self.users < 2 or self.policy not in POLICIES
                or not 0 <= self.heavy_nice <= 19 or self.heavy_yield_share < 0
                or min(self.solo_s, self.contended_s, self.saturate_s) <= self.settle_s):
            raise ConfigurationError(
                f"the fairness scenario needs >= 2 users, >= 1 lane, row and round, a policy of "
                f"{POLICIES}, heavy_nice 0-19, heavy_yield_share >= 0 and every phase longer "
                f"than settle_s: {self}")


PRESETS: dict[str, FairnessConfig] = {
    "full": FairnessConfig(),
    # six short rounds: the solo p95 rests on ~340 requests instead of ~125
    "quick": FairnessConfig(rounds=6, solo_s=10.0, contended_s=5.0, saturate_s=12.0,
                            preset="quick"),
}


def config_for(preset: str, **overrides: Any) -> FairnessConfig:
    """The preset's configuration with ``overrides`` (None values ignored)."""
    return replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index of ``values``: 1 when all are equal, 1/n when one has everything."""
    array = np.asarray(values, dtype=float)
    if array.size == 0 or not np.any(array):
        return 0.0
    return float(array.sum() ** 2 / (array.size * np.square(array).sum()))


@contextlib.contextmanager
def _gateway(server: Any, users: int, quota_rps: int,
             retry_after_s: float) -> Iterator[tuple[str, list[str]]]:
    """HAProxy in front of ``server``: its gRPC address and one token file per user."""
    from ..netlab import LocalHost
    from ..netlab.gateway import start_gateway
    from ..netlab.tokens import TokenIssuer
    from ..server.launcher import free_port

    with tempfile.TemporaryDirectory(prefix="fairness-gateway-") as folder, \
            LocalHost(Path(folder) / "logs") as here:
        issuer = TokenIssuer(Path(folder) / "issuer")
        tokens = [str(issuer.write(Path(folder) / f"user{index}.token", f"user{index}"))
                  for index in range(users)]
        gateway = start_gateway(here, [(server.grpc_address, server.ports["http"])],
                                public_key=issuer.public_key, directory=Path(folder) / "gateway",
                                quota_rps=quota_rps, retry_after_s=retry_after_s,
                                port=free_port(), stats_port=free_port(), http_port=free_port())
        yield gateway.address, tokens


@dataclass(frozen=True)
class UserSpec:
    """One user process (lanes: requests in flight; load: paced rate in light users')."""

    index: int
    url: str
    lanes: int
    rows: int
    policy: str = "fair"
    levels: int = 1
    load: float = 1.0
    timeout_s: float = 60.0
    nice: int = 0
    yield_share: float = 0.0
    token_file: str = ""


@dataclass(frozen=True)
class Phase:
    """User ``i`` does ``modes[i]`` (idle, paced, saturate) from ``start_at`` (monotonic)."""

    name: str
    start_at: float
    duration_s: float
    modes: tuple[str, ...]
    interval_s: float = 0.02


def lane_priority(spec: UserSpec, lane: int) -> int | None:
    """``lane``'s priority under ``fair`` (its depth, at most the last level); None otherwise."""
    return min(lane + 1, spec.levels) if spec.policy == "fair" else None


class _User:
    """The lanes of one user and what they measured (runs inside the user's process)."""

    def __init__(self, spec: UserSpec) -> None:
        from ..core.secrets import Secret
        from ..model import TritonModel
        from ..share import YieldGate

        self.spec = spec
        generator = np.random.default_rng(1000 + spec.index)
        self.inputs = {"features": generator.normal(size=(spec.rows, 6)).astype(np.float32)}
        retry = {"max_attempts": 20, "total_s": 120.0, "initial_backoff_s": 0.01,
                 "max_backoff_s": 0.5}
        headers = ({"authorization": Secret.from_file(spec.token_file, prefix="Bearer ")}
                   if spec.token_file else None)
        self.lanes = [TritonModel(spec.url, transport="grpc", max_in_flight=1, retry=retry,
                                  timeout_s=spec.timeout_s, headers=headers,
                                  priority=lane_priority(spec, lane))
                      for lane in range(spec.lanes)]
        self.gate: Any = None
        if spec.yield_share > 0:
            # its own client: the statistics never wait behind a lane's request
            self.gate = YieldGate(TritonModel(spec.url, transport="grpc"), spec.yield_share,
                                  burst_rows=spec.rows)
        self.records: list[tuple[float, float, int, bool, int]] = []
        self.lock = threading.Lock()

    def warm_up(self) -> None:
        answers = [np.array(lane(self.inputs)["probs"]) for lane in self.lanes for _ in range(3)]
        self.expected = answers[0]
        if not all(np.array_equal(answer, self.expected) for answer in answers):
            raise AssertionError(f"user {self.spec.index}: the server answered the same rows "
                                 "differently during warm-up")

    def _send(self, lane: int) -> None:
        sent = time.monotonic()
        try:
            answer = self.lanes[lane](self.inputs)["probs"]
            good = answer.shape[0] == self.spec.rows and np.array_equal(answer, self.expected)
            if self.gate is not None:
                self.gate.answered(answer.shape[0])
        except Exception as error:  # noqa: BLE001 - a failed request is counted, not fatal
            logger.warning("user %d lane %d: request failed: %s", self.spec.index, lane, error)
            good = False
        with self.lock:
            self.records.append((sent, time.monotonic(), self.spec.rows, good, lane))

    def run(self, phase: Phase) -> list[tuple[float, float, int, bool, int]]:
        """``[(sent, answered, rows, good, lane)]`` of every request sent in ``phase``."""
        mode, end = phase.modes[self.spec.index], phase.start_at + phase.duration_s
        self.records = []
        time.sleep(max(0.0, phase.start_at - time.monotonic()))
        if mode == "idle":
            time.sleep(max(0.0, end - time.monotonic()))
        elif mode == "paced":
            self._paced(phase)
        else:
            def closed_loop(lane: int) -> None:
                while time.monotonic() < end and (
                        self.gate is None or self.gate.acquire(self.spec.rows, deadline=end)):
                    self._send(lane)

            self._lanes(closed_loop, phase)()
        return self.records

    def _lanes(self, target: Any, phase: Phase) -> Callable[[], None]:
        """Start ``target(lane)`` on every lane; the function joining them."""
        threads = [threading.Thread(target=target, args=(lane,), daemon=True)
                   for lane in range(len(self.lanes))]
        for thread in threads:
            thread.start()

        def join() -> None:
            for thread in threads:
                thread.join(timeout=phase.duration_s + 2 * self.spec.timeout_s)
            if any(thread.is_alive() for thread in threads):
                raise RuntimeError(f"user {self.spec.index}: a lane runs after the phase")

        return join

    def _paced(self, phase: Phase) -> None:
        """Open loop at ``load / interval_s`` requests/s (intervals jittered +-50 %), each on the
        lowest free lane (its priority is its depth), or on the first lane to come free."""
        end = phase.start_at + phase.duration_s
        jitter = random.Random(self.spec.index * 7919 + int(phase.start_at))
        interval = phase.interval_s / self.spec.load
        # one inbox per lane: one condition shared by 20 lanes woke all of them for every
        # request, thousands of wake-ups a second taking cores from the other users
        inboxes: list[queue.SimpleQueue[bool]] = [queue.SimpleQueue() for _ in self.lanes]
        free = threading.Condition()
        busy = [False] * len(self.lanes)

        def lane_worker(lane: int) -> None:
            while inboxes[lane].get():
                self._send(lane)
                with free:
                    busy[lane] = False
                    free.notify()

        join = self._lanes(lane_worker, phase)
        next_at = phase.start_at + jitter.uniform(0, interval)
        try:
            while next_at < end:
                time.sleep(max(0.0, next_at - time.monotonic()))
                # the gate before the lane: the request keeps the lowest free lane's priority;
                # what the user wanted beyond its share is not sent
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
            join()


def user_task(task: dict, tasks: Any, control: Any, cache: dict) -> dict:
    """The :class:`~coffea_sonic.bench.clients.ClientPool` task of user ``task["index"]``: its
    process's lanes (made, niced and warmed up on the first phase), then ``task["phase"]`` from
    the pool's common start; its records and the requests the server refused (sent again)."""
    spec = task["specs"][task["index"]]
    if "user" not in cache:
        os.nice(spec.nice)
        cache["user"] = _User(spec)
        cache["user"].warm_up()
    user = cache["user"]
    refused = lambda: sum(lane.stats.failed_requests for lane in user.lanes)  # noqa: E731
    before = refused()
    ready_then_start(tasks, control)
    records = user.run(replace(task["phase"], start_at=time.monotonic()))
    return {"index": spec.index, "records": records, "rejected": refused() - before}


def _server(config: FairnessConfig, extra_args: Sequence[str] = ()) -> Any:
    from ..server import LocalTritonServer
    from ..server.repository import QueuePolicy

    options: dict[str, Any] = {"preferred_batch_sizes": [config.rows],
                               "max_queue_delay_microseconds": 0, "intra_op_threads": 1}
    if config.policy == "fair":
        # a policy on every level: Triton then keeps each level's queue instead of making and
        # erasing it as requests come and go
        policies = {level: QueuePolicy() for level in range(1, config.levels)}
        policies[config.levels] = QueuePolicy(max_queue_size=config.overflow_queue)
        options.update(priority_levels=config.levels, queue_policies=policies)
    extra: list[str] = []
    if config.concurrent_executions:
        options["rate_limiter_resources"] = {"execution": 1}
        extra = ["--rate-limit=execution_count",
                 f"--rate-limit-resource=execution:{config.concurrent_executions}"]
    return LocalTritonServer(models=[MODEL], device="cpu", instances=config.instances,
                             repository_options=options, extra_args=[*extra, *extra_args])


def _plan(config: FairnessConfig) -> list[tuple[str, float, tuple[str, ...]]]:
    """``(name, seconds, mode of each user)`` of every phase, user 0 the heavy one."""
    idle = ("idle",) * (config.users - 2)
    plan = []
    for index in range(1, config.rounds + 1):
        plan += [(f"solo-{index}", config.solo_s, ("idle", "paced", *idle)),
                 (f"contended-{index}", config.contended_s, ("paced",) * config.users)]
    return plan + [("saturate", config.saturate_s, ("saturate",) * config.users)]


def _figures(config: FairnessConfig, phases: list[Phase],
             raw: dict[str, dict[int, Any]]) -> dict[str, Any]:
    records = {name: {user: got["records"] for user, got in per.items()}
               for name, per in raw.items()}
    kind = {phase.name: phase.name.split("-")[0] for phase in phases}
    windows = {phase.name: (phase.start_at + config.settle_s, phase.start_at + phase.duration_s)
               for phase in phases}

    def latencies(want: str, users: Sequence[int], round_: str = "") -> list[float]:
        return [done - sent for name in records
                if kind[name] == want and round_ in ("", name.rpartition("-")[2])
                for user in users for sent, done, _, good, _ in records[name][user]
                if good and windows[name][0] <= sent < windows[name][1]]

    def by_kind(count: Callable[[str], int]) -> dict[str, int]:
        totals: dict[str, int] = {}
        for name in records:
            totals[kind[name]] = totals.get(kind[name], 0) + count(name)
        return totals

    lights = range(1, config.users)
    solo, loaded, heavy = latencies("solo", [1]), latencies("contended", lights), latencies(
        "contended", [0])
    low, high = windows["saturate"]
    goodput = [sum(rows for _, done, rows, good, _ in records["saturate"][user]
                   if good and low <= done < high) / (high - low) for user in range(config.users)]
    solo_p95, loaded_p95 = percentile(solo, 95) * 1e3, percentile(loaded, 95) * 1e3
    figures = {
        "jain": jain(goodput),
        "light_p95_ratio": loaded_p95 / solo_p95 if solo_p95 > 0 else float("nan"),
        "light_p95_ms_solo": solo_p95, "light_p95_ms_contended": loaded_p95,
        "light_p50_ms_solo": percentile(solo, 50) * 1e3,
        "light_p50_ms_contended": percentile(loaded, 50) * 1e3,
        "heavy_p50_ms_contended": percentile(heavy, 50) * 1e3,
        "light_p95_ratio_by_round": [
            percentile(latencies("contended", lights, str(i)), 95)
            / percentile(latencies("solo", [1], str(i)), 95)
            for i in range(1, config.rounds + 1)],
        "requests": {"solo": len(solo), "contended_light": len(loaded),
                     "contended_heavy": len(heavy)},
        # what the heavy user sent beside the light ones, in light users' loads
        "heavy_load_contended": (len(heavy) / (len(loaded) / (config.users - 1))
                                 if loaded else float("nan")),
        "goodput_rows_per_s": goodput,
        "heavy_share_of_goodput": goodput[0] / sum(goodput) if sum(goodput) else float("nan"),
        "failed_requests": by_kind(lambda name: sum(
            1 for user in records[name].values() for record in user if not record[3])),
        "rejected_then_retried": by_kind(lambda name: sum(
            got["rejected"] for got in raw[name].values())),
        "heavy_rejected_then_retried": by_kind(lambda name: raw[name][0]["rejected"]),
    }
    figures["goals"] = {name: {"goal": f"{op} {bound}", "met": bool(
        figures[name] >= bound if op == ">=" else figures[name] <= bound)}
        for name, (op, bound) in GOALS.items()}
    figures["met"] = all(goal["met"] for goal in figures["goals"].values())
    return figures


def _specs(config: FairnessConfig, url: str, tokens: Sequence[str]) -> list[UserSpec]:
    heavy = {"load": float(config.heavy_factor), "lanes": config.heavy_lanes,
             "nice": config.heavy_nice,
             # the cap is part of the fair policy; behind the gateway its quota caps
             "yield_share": config.heavy_yield_share if config.policy == "fair" else 0.0}
    return [UserSpec(**{"index": user, "url": url, "rows": config.rows, "policy": config.policy,
                        "levels": config.levels, "lanes": config.light_lanes,
                        "token_file": tokens[user] if tokens else "",
                        **(heavy if user == 0 else {})}) for user in range(config.users)]


def run_fairness(config: FairnessConfig, *, progress: Callable[[str], None] | None = None,
                 server_args: Sequence[str] = (), user_task: Callable[..., Any] = user_task,
                 on_records: Callable[[list[Phase], dict], None] | None = None) -> dict[str, Any]:
    """Run the scenario; what ``results.json`` holds. ``server_args``, ``user_task`` (with
    :func:`user_task`'s signature) and ``on_records`` are the hooks of ``bench trace``."""
    from .machine import machine_info

    config.check()
    progress = progress or (lambda message: logger.info("%s", message))
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(_server(config, server_args))
        url, tokens = server.url(MODEL), []
        if config.policy == "gateway":
            # requests/s per subject: gateway_quota_factor light users' paced rates
            quota = max(1, math.ceil(config.gateway_quota_factor / config.interval_s))
            address, tokens = stack.enter_context(_gateway(
                server, config.users, quota, config.gateway_retry_after_s))
            url = f"triton+grpc://{address}/{MODEL}"
            progress(f"fairness: gateway {address}, {quota} inference requests/s per user")
        progress(f"fairness: server up ({config.instances} instances, policy {config.policy}); "
                 f"starting {config.users} users")
        phases, records = _run_users(config, _specs(config, url, tokens), progress, user_task)
    (on_records or (lambda *_: None))(phases, records)
    return {"scenario": "fairness", "machine": machine_info(), "config": asdict(config),
            "command": " ".join(["coffea-sonic", *sys.argv[1:]]) if sys.argv else "",
            "wall_s": time.monotonic() - started,
            "fairness": _figures(config, phases, records)}


def _run_users(config: FairnessConfig, specs: list[UserSpec], progress: Callable[[str], None],
               target: Callable[..., Any]) -> tuple[list[Phase], dict[str, dict[int, Any]]]:
    pool = ClientPool(config.users, target)
    phases: list[Phase] = []
    records: dict[str, dict[int, Any]] = {}
    try:
        for name, duration, modes in _plan(config):
            progress(f"fairness: phase {name} ({duration:.0f} s)")
            phase = Phase(name, 0.0, duration, modes, config.interval_s)
            task = {"phase": phase, "specs": specs, "duration": duration}
            # every user starts at the pool's moment, after the last phase's answers came back
            _, results = pool.run(task, config.users, on_start=lambda at: phases.append(replace(
                phase, start_at=at - time.time() + time.monotonic())))
            failed = [result["error"] for result in results if "error" in result]
            if failed:
                raise RuntimeError(f"fairness: a user failed in phase {name}: {failed[0]}")
            records[name] = {result["index"]: result for result in results}
    finally:
        pool.close()
    return phases, records
