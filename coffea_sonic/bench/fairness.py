"""``coffea-sonic bench fairness``: several users share one server; is it fair?

Eight users (separate processes, :mod:`coffea_sonic.bench.fairness_users`) send ``jet_tagger``
requests of the same size (``rows``, 8192) to one embedded tritonserver. One user is *heavy*: it
wants ten times the load of each *light* user (ten times the requests in flight, ten times the
request rate), runs niced (``heavy_nice``, 5), as a batch system runs a bulk job, and *yields*:
while the others are served it sends at most ``heavy_yield_share`` (0.2) of the rows/s they get
together (:class:`coffea_sonic.share.YieldGate`, from the server's statistics). Three phases, all
users' processes alive throughout:

1. ``solo``: one light user alone, paced (one request every ``interval_s`` on average).
2. ``contended``: every user paced, the light ones as in ``solo``, the heavy one asking for ten
   times as many requests (one every ``interval_s / 10``); its yield gate lets ~1.4 light users'
   worth through (``heavy_load_contended``), the rest is not sent.
3. ``saturate``: every user saturates (sends each next request as soon as one is answered), the
   heavy one with ten times the window.

``solo`` and ``contended`` alternate ``rounds`` times before ``saturate``, so that both see the same
background load of a shared machine; each figure pools its phases, and
``light_p95_ratio_by_round`` gives each round's ratio alone (its spread).

Request size: a light user sends 51 k rows/s, 8192 rows (192 KiB, the jets of ~2.7 k events) every
160 ms; the heavy one ten times that. Not 2048 rows every 40 ms: on a small machine such a
request costs several times more CPU in the client and the server (gRPC, Python) than its
inference, so the scenario would measure per-request overhead; coffea-sonic itself sends a chunk's rows in requests of up to 4 MiB
(174 k rows of jet_tagger), so 8192 rows is still a small request. Both phases use the same size.

Figures (``results.json``, key ``fairness``):

* ``jain``: Jain's fairness index ``(sum x)^2 / (n * sum x^2)`` over the users' *goodput while all
  saturate*: for user ``i``, the rows of its requests answered completely and correctly whose
  answer arrived inside the measurement window of the ``saturate`` phase, divided by the window's
  length. The window starts ``settle_s`` after the phase starts (every user has its full window of
  requests in flight by then) and ends when the phase ends (no user stops sending before); during it
  every user always has as many requests in flight as its window allows, so each wants more than a
  1/n share and a fair server gives each the same goodput (index 1; 1/n if one user gets all).
* ``light_p95_ratio``: the 95th percentile of the light users' request latencies (send to complete,
  correct answer) in the ``contended`` phases, over the same percentile for the light user alone
  in the ``solo`` phases (requests sent after ``settle_s`` in each phase).

Goals: ``jain >= 0.9`` and ``light_p95_ratio <= 1.5``.

Policy ``fair`` (the default) is what Triton offers, from the repository writer
(:func:`coffea_sonic.server.repository.model_config`): ``light_lanes + 1`` dynamic-batcher priority
levels, and every user sends its ``k``-th concurrent request at priority ``k``
(``TritonModel(priority=k)``, one client per lane), its requests beyond ``light_lanes`` at the last
level, the *overflow* level, whose queue holds ``overflow_queue`` requests: the batcher serves the
users round robin by depth (fairness_users), and a user's extra concurrency waits at the overflow
level or is refused there ("Exceeds maximum queue size"), which its client takes as overload:
it backs off and sends again. One request per execution (preferred batch size = rows per request),
so a level-1 request never rides in a batch behind others. And the heavy user's client yields (its
``YieldGate``): priorities order *queued* requests only, and beside light users below their share
little waits in Triton's queue; what slows them there is the heavy user's requests and executions
sharing the cores with theirs, so while they are served it sends at most 0.2 times their rows/s
(the server's ``inference_count`` polled every 0.25 s, minus its own rows). When all saturate the
others get ~3 M rows/s together, the cap (~0.6 M) does not bind, and the priorities share the
server. Policy ``fifo`` is the same server without priorities and without the cap, for comparison.

Why the policy is built this way (where a light request's time goes, what brought the ratio
down, what was tried without a gain, and every run): benchmarks/RESULTS.md, "Many users on one
server" (``benchmarks/fairness_trace.py`` traces a run). In short: on a machine where clients and
server share the cores, a light user's extra latency is the heavy user's work on those cores, so
the heavy user yields (keyed on what the others get, not on its own latency); one-request calls are
sent in the caller's thread (no hand-offs between threads); the heavy user's lanes are woken one at
a time; and the model has two instances, since Triton stalls queued requests for 0.5 s at a time
when a one-instance model has a non-default queue policy.

>>> jain([1.0, 1.0, 1.0, 1.0]), round(jain([10.0, 1, 1, 1, 1, 1, 1, 1]), 3)
(1.0, 0.338)
>>> percentile([1.0, 2.0, 3.0, 4.0], 50)
2.5
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .fairness_gateway import gateway_quota, user_gateway
from .fairness_users import POLICIES, Phase, UserSpec, user_main

logger = logging.getLogger(__name__)

__all__ = ["FairnessConfig", "GOALS", "PRESETS", "jain", "percentile", "run_fairness"]

#: What the scenario must reach (checked and recorded by every run; the command exits 1 if one is
#: missed): Jain's index of goodput, the light users' p95 ratio, and the heavy user, with ten
#: times the requests in flight, at most twice a fair share (1/users) of the goodput.
GOALS: dict[str, tuple[str, float]] = {"jain": (">=", 0.9), "light_p95_ratio": ("<=", 1.5),
                                       "heavy_share_of_goodput": ("<=", 2 / 8)}
MODEL = "jet_tagger"


@dataclass(frozen=True)
class FairnessConfig:
    """Shape and length of the scenario (see the module docstring)."""

    users: int = 8
    heavy_factor: int = 10
    light_lanes: int = 2
    #: rows per request and a light user's mean interval between requests (51 k rows/s)
    rows: int = 8192
    interval_s: float = 0.16
    #: solo and contended phases alternate this many times
    rounds: int = 4
    solo_s: float = 8.0
    contended_s: float = 10.0
    saturate_s: float = 20.0
    settle_s: float = 1.0
    policy: str = "fair"
    instances: int = 2
    #: niceness of the heavy user's process (a bulk job at a lower CPU priority, as a batch
    #: system runs one; 19 starved its client while all saturate here: Jain 0.89)
    heavy_nice: int = 5
    #: executions at once (Triton's rate limiter; 0: one per instance)
    concurrent_executions: int = 0
    #: requests that may wait at the overflow level (the last one) before more are rejected
    overflow_queue: int = 2
    #: while the others are served, the heavy user sends at most this share of the rows/s they
    #: get together (:class:`coffea_sonic.share.YieldGate`; 0: no cap; policy fair only)
    heavy_yield_share: float = 0.2
    #: policy gateway: each user's quota at the gateway, in light users' paced rates, and the
    #: wait it asks of a refused client (:mod:`coffea_sonic.bench.fairness_gateway`)
    gateway_quota_factor: float = 1.6
    gateway_retry_after_s: float = 0.2
    preset: str = "full"

    @property
    def heavy_lanes(self) -> int:
        return self.heavy_factor * self.light_lanes

    @property
    def levels(self) -> int:
        """Priority levels of the model: one per light lane, and the overflow level."""
        return self.light_lanes + 1

    def check(self) -> None:
        from ..errors import ConfigurationError

        if (self.users < 2 or self.light_lanes < 1 or self.heavy_factor < 1 or self.rows < 1
                or self.rounds < 1):
            raise ConfigurationError(f"the fairness scenario needs >= 2 users, >= 1 lane and "
                                     f">= 1 row per request: {self}")
        if self.policy not in POLICIES:
            raise ConfigurationError(f"policy must be one of {POLICIES}, not {self.policy!r}")
        if not 0 <= self.heavy_nice <= 19:
            raise ConfigurationError(f"heavy_nice must be 0-19, not {self.heavy_nice!r}")
        if self.heavy_yield_share < 0:
            raise ConfigurationError(f"heavy_yield_share must be >= 0 (0: no cap), not "
                                     f"{self.heavy_yield_share!r}")
        if min(self.solo_s, self.contended_s, self.saturate_s) <= self.settle_s:
            raise ConfigurationError(f"every phase must last longer than settle_s: {self}")


PRESETS: dict[str, FairnessConfig] = {
    "full": FairnessConfig(),
    # six short rounds: the solo and contended phases see the same load of other jobs, and the
    # solo p95 (one user, ~6 requests/s) rests on ~340 requests instead of ~125
    "quick": FairnessConfig(rounds=6, solo_s=10.0, contended_s=5.0, saturate_s=12.0,
                            preset="quick"),
}


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index of ``values``: 1 when all are equal, 1/n when one has everything."""
    array = np.asarray(values, dtype=float)
    if array.size == 0 or not np.any(array):
        return 0.0
    return float(array.sum() ** 2 / (array.size * np.square(array).sum()))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation; NaN for no values)."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def _server(config: FairnessConfig, extra_args: Sequence[str] = ()):
    from ..server import LocalTritonServer
    from ..server.repository import QueuePolicy

    options: dict[str, Any] = {"preferred_batch_sizes": [config.rows],
                               "max_queue_delay_microseconds": 0, "intra_op_threads": 1}
    if config.policy == "fair":  # fifo and gateway: no priorities
        # every level gets a policy: Triton then keeps each level's queue instead of making
        # and erasing it as requests come and go
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
    """``(name, seconds, mode of each user)`` of every phase, in order: ``solo-i`` and
    ``contended-i`` alternate ``rounds`` times (both see the same background load of the
    machine), then ``saturate``."""
    users = config.users  # user 0 is the heavy one
    plan = []
    for round_ in range(1, config.rounds + 1):
        plan += [(f"solo-{round_}", config.solo_s, ("idle", "paced") + ("idle",) * (users - 2)),
                 (f"contended-{round_}", config.contended_s, ("paced",) * users)]
    return plan + [("saturate", config.saturate_s, ("saturate",) * users)]


def _kind(phase_name: str) -> str:
    return phase_name.split("-")[0]


def _round(phase_name: str) -> int | None:
    """The round of a ``solo-i``/``contended-i`` phase (None for ``saturate``)."""
    _, _, number = phase_name.partition("-")
    return int(number) if number else None


def _collect(results: Any, users: int, what: str, timeout_s: float,
             processes: Sequence[Any]) -> dict[int, list]:
    collected: dict[int, list] = {}
    deadline = time.monotonic() + timeout_s
    while len(collected) < users:
        left = deadline - time.monotonic()
        if left <= 0 or not all(p.is_alive() or p.exitcode == 0 for p in processes):
            dead = [p.pid for p in processes if p.exitcode not in (None, 0)]
            raise RuntimeError(f"fairness: {users - len(collected)} users did not report {what} "
                               f"within {timeout_s:.0f} s (processes that died: {dead})")
        try:
            index, name, payload = results.get(timeout=min(left, 1.0))
        except Exception:  # queue.Empty: look at the processes again
            continue
        if name == "error":
            raise RuntimeError(f"fairness: user {index} failed: {payload}")
        collected[index] = payload
    return collected


def _failed(records: dict[str, dict[int, list]]) -> dict[str, int]:
    """Requests that failed, per phase kind."""
    failed: dict[str, int] = {}
    for name, per_user in records.items():
        failed[_kind(name)] = failed.get(_kind(name), 0) + sum(
            1 for user in per_user.values() for *_, good, _ in user if not good)
    return failed


def _figures(config: FairnessConfig, phases: list[Phase],
             records: dict[str, dict[int, list]]) -> dict[str, Any]:
    def window(phase: Phase) -> tuple[float, float]:
        return phase.start_at + config.settle_s, phase.start_at + phase.duration_s

    rejected = {name: {user: per_user[user]["rejected"] for user in per_user}
                for name, per_user in records.items()}
    records = {name: {user: per_user[user]["records"] for user in per_user}
               for name, per_user in records.items()}
    def latencies(kind: str, users: Sequence[int], round_: int | None = None) -> list[float]:
        out = []
        for phase in phases:
            if _kind(phase.name) == kind and round_ in (None, _round(phase.name)):
                low, high = window(phase)
                out += [done - sent for user in users
                        for sent, done, _, good, _ in records[phase.name][user]
                        if good and low <= sent < high]
        return out

    solo = latencies("solo", [1])
    loaded = latencies("contended", range(1, config.users))
    heavy_loaded = latencies("contended", [0])
    (saturate,) = [phase for phase in phases if phase.name == "saturate"]
    low, high = window(saturate)
    goodput = [sum(rows for _, done, rows, good, _ in records["saturate"][user]
                   if good and low <= done < high) / (high - low) for user in range(config.users)]
    solo_p95, loaded_p95 = percentile(solo, 95) * 1e3, percentile(loaded, 95) * 1e3
    figures = {
        "jain": jain(goodput),
        "light_p95_ratio": loaded_p95 / solo_p95 if solo_p95 > 0 else float("nan"),
        "light_p95_ms_solo": solo_p95, "light_p95_ms_contended": loaded_p95,
        "light_p50_ms_solo": percentile(solo, 50) * 1e3,
        "light_p50_ms_contended": percentile(loaded, 50) * 1e3,
        "heavy_p50_ms_contended": percentile(heavy_loaded, 50) * 1e3,
        # the ratio of each round alone (solo-i against contended-i): its spread within a run
        "light_p95_ratio_by_round": [
            percentile(latencies("contended", range(1, config.users), i), 95)
            / percentile(latencies("solo", [1], i), 95) for i in range(1, config.rounds + 1)],
        "requests": {"solo": len(solo), "contended_light": len(loaded),
                     "contended_heavy": len(heavy_loaded)},
        # what the heavy user sent beside the light ones, in light users' loads (it wants
        # heavy_factor; its yield gate holds it back)
        "heavy_load_contended": (len(heavy_loaded) / (len(loaded) / (config.users - 1))
                                 if loaded else float("nan")),
        "goodput_rows_per_s": goodput,
        "heavy_share_of_goodput": goodput[0] / sum(goodput) if sum(goodput) else float("nan"),
        "failed_requests": _failed(records),
        "rejected_then_retried": _by_kind({name: sum(per_user.values())
                                           for name, per_user in rejected.items()}),
        "heavy_rejected_then_retried": _by_kind({name: per_user.get(0, 0)
                                                 for name, per_user in rejected.items()}),
    }
    figures["goals"] = {name: {"goal": f"{op} {bound}", "met": bool(
        figures[name] >= bound if op == ">=" else figures[name] <= bound)}
        for name, (op, bound) in GOALS.items()}
    figures["met"] = all(goal["met"] for goal in figures["goals"].values())
    return figures


def _by_kind(per_phase: dict[str, int]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for name, count in per_phase.items():
        totals[_kind(name)] = totals.get(_kind(name), 0) + count
    return totals


def _specs(config: FairnessConfig, url: str, tokens: Sequence[str]) -> list[UserSpec]:
    return [UserSpec(index=user, url=url, rows=config.rows, policy=config.policy,
                     levels=config.levels,
                     load=float(config.heavy_factor) if user == 0 else 1.0,
                     lanes=config.heavy_lanes if user == 0 else config.light_lanes,
                     nice=config.heavy_nice if user == 0 else 0,
                     # the cap is part of the fair policy: fifo is the server without one, and
                     # behind the gateway its quota does the capping
                     yield_share=config.heavy_yield_share
                     if user == 0 and config.policy == "fair" else 0.0,
                     token_file=tokens[user] if tokens else "")
            for user in range(config.users)]


def run_fairness(config: FairnessConfig, *, progress: Callable[[str], None] | None = None,
                 server_args: Sequence[str] = (), user_target: Callable[..., None] = user_main,
                 on_records: Callable[[list[Phase], dict], None] | None = None) -> dict[str, Any]:
    """Run the scenario (module docstring) and return what ``results.json`` holds. A tracing
    run (:mod:`coffea_sonic.bench.fairness_trace`) adds tritonserver arguments, its own user
    process entry point (``user_main``'s signature) and a look at the raw records."""
    from .machine import machine_info

    config.check()
    progress = progress or (lambda message: logger.info("%s", message))
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(_server(config, server_args))
        url, tokens = server.url(MODEL), []
        if config.policy == "gateway":
            quota = gateway_quota(config.interval_s, config.gateway_quota_factor)
            address, tokens = stack.enter_context(user_gateway(
                server, config.users, quota, config.gateway_retry_after_s))
            url = f"triton+grpc://{address}/{MODEL}"
            progress(f"fairness: gateway {address}, {quota} inference requests/s per user")
        progress(f"fairness: server up ({config.instances} instances, policy {config.policy}); "
                 f"starting {config.users} users")
        phases, records = _run_users(config, _specs(config, url, tokens), progress, user_target)
    if on_records is not None:
        on_records(phases, records)
    figures = _figures(config, phases, records)
    return {"scenario": "fairness", "machine": machine_info(), "config": asdict(config),
            "command": " ".join(["coffea-sonic", *sys.argv[1:]]) if sys.argv else "",
            "wall_s": time.monotonic() - started, "fairness": figures}


def _run_users(config: FairnessConfig, specs: list[UserSpec], progress: Callable[[str], None],
               target: Callable[..., None]) -> tuple[list[Phase], dict[str, dict[int, list]]]:
    """Start the user processes, run every phase of the plan, stop them."""
    context = multiprocessing.get_context("spawn")
    commands = [context.Queue() for _ in range(config.users)]
    results = context.Queue()
    processes = [context.Process(target=target, args=(spec, commands[spec.index], results),
                                 name=f"fairness-user-{spec.index}", daemon=True)
                 for spec in specs]
    phases: list[Phase] = []
    records: dict[str, dict[int, list]] = {}
    try:
        for process in processes:
            process.start()
        _collect(results, config.users, "ready", 120.0, processes)
        for name, duration, modes in _plan(config):
            # every user starts at the same moment (one clock for all processes), after the
            # last answers of the previous phase came back
            phase = Phase(name, time.monotonic() + 0.5, duration, modes, config.interval_s)
            phases.append(phase)
            progress(f"fairness: phase {phase.name} ({phase.duration_s:.0f} s)")
            for queue in commands:
                queue.put(phase)
            records[phase.name] = _collect(
                results, config.users, phase.name,
                phase.start_at + phase.duration_s - time.monotonic() + 180.0, processes)
    finally:
        for queue in commands:
            queue.put(None)
        for process in processes:
            if process.pid is None:  # never started
                continue
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    return phases, records


def write_results(results: dict[str, Any], output: str | os.PathLike) -> Path:
    """Write ``results.json`` into ``output`` (created); return its path."""
    directory = Path(output)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "results.json"
    path.write_text(json.dumps(results, indent=2, default=float))
    return path


def summary_lines(results: dict[str, Any]) -> list[str]:
    """What the command prints: the two figures against their goals, and the goodput shares."""
    figures = results["fairness"]
    lines = []
    for name, goal in figures["goals"].items():
        lines.append(f"  {name}: {figures[name]:.3f} (goal {goal['goal']}: "
                     f"{'met' if goal['met'] else 'MISSED'})")
    rounds = ", ".join(f"{ratio:.2f}" for ratio in figures["light_p95_ratio_by_round"])
    lines.append(f"  light p95 {figures['light_p95_ms_solo']:.1f} ms alone, "
                 f"{figures['light_p95_ms_contended']:.1f} ms beside the heavy user (ratio by "
                 f"round: {rounds}); the heavy user sent {figures['heavy_load_contended']:.1f}x "
                 f"a light user's load beside them (wants {results['config']['heavy_factor']}x); "
                 f"its share of goodput while all saturate {figures['heavy_share_of_goodput']:.1%} "
                 f"(1/{results['config']['users']} is fair)")
    return lines


def config_for(preset: str, **overrides: Any) -> FairnessConfig:
    """The preset's configuration with ``overrides`` (None values ignored)."""
    return replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})
