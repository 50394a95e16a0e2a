"""What shadow validation costs and how often it cries wolf: the demo's analysis with shadow
validation off and at 0.001, alternated in one run.

One embedded server with the demo's models (honest: the zoo's) and one Dask ``LocalCluster`` serve
every pass; each pass runs the demo's analysis (coffea ``Runner`` + ``DaskExecutor``, the demo's
processor and chunk size) over the same synthetic sample, alternating shadow off / on (the order
of each pair flips, so a drift in the machine's load does not favour one side). Recorded per
pass: wall time, events/s, rows recomputed, alarms and the shadow thread's seconds, and the CPU
seconds the run's processes used (Dask workers; the server and its model processes); summed:
false alarms over the shadowed passes (0 expected: an honest server), the throughput ratio on/off
(median of the pairs), the same ratio per CPU second (events per CPU second of the workers, and
of workers + server: what the demo's throughput is on a machine it keeps busy, and far less
sensitive than wall time to other jobs on a shared box) and the shadow thread's share of the
workers' time. The machine's load is recorded beside the figures (a shared box: only the ratios
are meaningful).

Command: ``python -m coffea_sonic.bench.shadow_runs --pairs 20 --events 4000 -o DIR`` (writes
``DIR/shadow_runs.json`` and ``DIR/shadow_runs.png``).

>>> median_ratio([(10.0, 10.0), (12.0, 11.4), (8.0, 8.4)])
1.0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from .cache_runs import load_now

__all__ = ["cpu_seconds", "main", "median_ratio", "quartiles", "run_pairs"]

MODELS = ("jet_tagger", "particlenet", "deepmet")


def median_ratio(pairs: list[tuple[float, float]]) -> float:
    """Median over pairs of (events/s with shadow) / (events/s without), rounded to 3 places."""
    return round(statistics.median(on / off for off, on in pairs), 3)


def cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float]:
    """User + system CPU seconds so far of each group of processes (and their children)."""
    import psutil

    found: dict[str, float] = {}
    for group, roots in pids.items():
        total = 0.0
        for pid in roots:
            try:
                root = psutil.Process(pid)
                for process in [root, *root.children(recursive=True)]:
                    times = process.cpu_times()
                    total += times.user + times.system
            except psutil.NoSuchProcess:
                continue
        found[group] = total
    return found


def quartiles(pairs: list[tuple[float, float]]) -> list[float]:
    """Quartiles over pairs of on / off (empty for fewer than two pairs).

    >>> quartiles([(10.0, 9.0), (10.0, 10.0), (10.0, 11.0)])
    [0.9, 1.0, 1.1]
    """
    if len(pairs) < 2:
        return []
    return [round(q, 3) for q in statistics.quantiles([on / off for off, on in pairs], n=4)]


def _pass(runner: Any, fileset: dict[str, list[str]], base: str, shadow: float,
          pids: dict[str, list[int]]) -> dict[str, Any]:
    from ..examples.jet_tagging import JetTaggingProcessor

    analysis = JetTaggingProcessor(base, physics=True, use_constituents="auto", max_in_flight=4,
                                   shadow=shadow)
    before = cpu_seconds(pids)
    started = time.perf_counter()
    output = runner({name: {"files": {path: "Events" for path in files}}
                     for name, files in fileset.items()}, treename="Events",
                    processor_instance=analysis)
    wall_s = time.perf_counter() - started
    used = {group: round(seconds - before[group], 3)
            for group, seconds in cpu_seconds(pids).items()}
    events = sum(int(entry["events"]) for entry in output["cutflow"].values())
    stats = output["inference"]
    return {"shadow": shadow, "wall_s": round(wall_s, 3), "events": events,
            "events_per_s": round(events / wall_s, 1), "cpu_s": used,
            "shadow_rows": {name: int(s.shadow_rows) for name, s in stats.items()},
            "alarms": sum(int(s.shadow_alarms) for s in stats.values()),
            "shadow_s": round(sum(s.shadow_s for s in stats.values()), 4),
            "load_1m": load_now()["load_1m"]}


def run_pairs(pairs: int, events: int, workdir: Path, shadow: float = 0.001,
              workers: int = 2) -> dict[str, Any]:
    """Alternate ``pairs`` passes without and with shadow validation (see the module docstring)."""
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema
    from distributed import Client, LocalCluster

    from ..data.synthetic import write_sample
    from ..demo import DEFAULT_CHUNKSIZE
    from ..server import LocalTritonServer

    fileset = write_sample(workdir / "sample", events=events // 2, files=2, seed=0)
    schema = type("SyntheticNanoAODSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
    passes: list[dict[str, Any]] = []
    with ExitStack() as stack:
        server = stack.enter_context(LocalTritonServer(models=list(MODELS), device="cpu"))
        cluster = stack.enter_context(LocalCluster(n_workers=workers, threads_per_worker=1,
                                                   host="127.0.0.1", dashboard_address=None))
        client = stack.enter_context(Client(cluster))
        runner = processor.Runner(executor=processor.DaskExecutor(client=client, status=False),
                                  schema=schema, chunksize=DEFAULT_CHUNKSIZE, savemetrics=False)
        base = f"triton+grpc://{server.grpc_address}"
        pids = {"workers": list(client.run(os.getpid).values()), "server": [server.pid]}
        # warm-up, both ways: workers' imports, the server's sessions, and each worker's
        # reference engines (made once per process: kept apart from the steady state)
        warmup = [_pass(runner, fileset, base, value, pids) for value in (0.0, shadow)]
        for index in range(pairs):
            order = (0.0, shadow) if index % 2 == 0 else (shadow, 0.0)
            done = {value: _pass(runner, fileset, base, value, pids) for value in order}
            passes += [done[0.0], done[shadow]]
    return {**_summary(passes, pairs, events, shadow, workers), "warmup": warmup}


def _per_cpu_second(passes: list[dict[str, Any]], groups: tuple[str, ...]) -> list[tuple]:
    """(off, on) events per CPU second of ``groups``, per pair."""
    rates = [p["events"] / max(1e-9, sum(p["cpu_s"][g] for g in groups)) for p in passes]
    return [(rates[i], rates[i + 1]) for i in range(0, len(rates), 2)]


def _summary(passes: list[dict[str, Any]], pairs: int, events: int, shadow: float,
             workers: int) -> dict[str, Any]:
    pairs_rate = [(passes[i]["events_per_s"], passes[i + 1]["events_per_s"])
                  for i in range(0, len(passes), 2)]
    shadowed = [p for p in passes if p["shadow"] > 0]
    worker_cpu = _per_cpu_second(passes, ("workers",))
    all_cpu = _per_cpu_second(passes, ("workers", "server"))
    return {"shadow": shadow, "pairs": pairs, "events_per_pass": events,
            "ratio_on_off_median": median_ratio(pairs_rate),
            "ratio_on_off_quartiles": quartiles(pairs_rate),
            "ratio_on_off_per_worker_cpu_s_median": median_ratio(worker_cpu),
            "ratio_on_off_per_worker_cpu_s_quartiles": quartiles(worker_cpu),
            "ratio_on_off_per_cpu_s_median": median_ratio(all_cpu),
            "ratio_on_off_per_cpu_s_quartiles": quartiles(all_cpu),
            "false_alarms": sum(p["alarms"] for p in shadowed),
            "shadowed_passes": len(shadowed),
            "rows_recomputed": sum(sum(p["shadow_rows"].values()) for p in shadowed),
            # the shadow thread's seconds over the workers' seconds (wall x workers) of those
            # passes: what shadow validation takes from the run, without the run-to-run noise
            "shadow_share_of_worker_time": round(
                sum(p["shadow_s"] for p in shadowed)
                / (workers * sum(p["wall_s"] for p in shadowed)), 6),
            "passes": passes, "load": load_now()}


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    passes = result["passes"]
    figure, axis = plt.subplots(figsize=(7, 3.5))
    for value, label in ((0.0, "shadow off"), (result["shadow"], f"shadow {result['shadow']:g}")):
        picked = [(i, p["events_per_s"]) for i, p in enumerate(passes) if p["shadow"] == value]
        axis.plot(*zip(*picked), "o", label=label)
    axis.set_xlabel("pass (alternating)")
    axis.set_ylabel("events/s")
    axis.set_title(f"median ratio on/off {result['ratio_on_off_median']}, "
                   f"false alarms {result['false_alarms']} in {result['shadowed_passes']} passes")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--events", type=int, default=4000, help="events per pass (2 datasets)")
    parser.add_argument("--shadow", type=float, default=0.001)
    parser.add_argument("-o", "--output", default="shadow-runs")
    args = parser.parse_args(argv)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    result = run_pairs(args.pairs, args.events, output, args.shadow)
    (output / "shadow_runs.json").write_text(json.dumps(result, indent=2))
    _plot(result, output / "shadow_runs.png")
    print(json.dumps({k: v for k, v in result.items() if k != "passes"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
