"""A server SIGKILLed mid-run with ``fallback="cpu"``: the run's wall time against a healthy run.

The example analysis (jet_tagger, particlenet_lite) under ``processor.Runner`` with a Dask
LocalCluster of 2 single-threaded workers, over 16 chunks, at a user's defaults plus
``fallback="cpu"``, three ways: ``healthy``, ``killed`` (the server SIGKILLed once three chunks
are done) and ``cpu_only`` (no server). ``measure`` writes ``outage.json`` and ``outage.png``;
the goal: ``killed`` within twice ``healthy`` plus the connect timeout.

Run from a checkout (it is not part of the installed package): ``python benchmarks/outage_bench.py
--help``; it writes benchmarks/results/cpu2-outage (RESULTS.md's) unless ``-o`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from coffea import processor
from coffea.nanoevents import NanoAODSchema

from coffea_sonic.bench.commands import add_numbers
from coffea_sonic.examples.jet_tagging import JetTaggingProcessor

MODELS = ["jet_tagger", "particlenet_lite"]
QuietSchema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
KILL_AFTER_CHUNKS = 3
RESULTS = Path(__file__).resolve().parent / "results" / "cpu2-outage"

DESCRIPTION = """\
Runs the example analysis (jet_tagger, particlenet_lite) under processor.Runner with a Dask
LocalCluster of 2 workers over 16 chunks, with fallback='cpu', three times: the server healthy,
the server SIGKILLed once 3 chunks are done, and no server at all. Writes outage.json and
outage.png into -o DIR; the goal is the killed run within twice the healthy run plus the connect
timeout (10 s).

examples:
  python benchmarks/outage_bench.py                 # 16 000 events per dataset (about a minute)
  python benchmarks/outage_bench.py --events 4000 -o /tmp/outage
"""


def build_parser() -> argparse.ArgumentParser:
    """The options; ``-o`` defaults to the folder RESULTS.md names."""
    parser = argparse.ArgumentParser(prog="outage_bench.py", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", default=str(RESULTS), metavar="DIR",
                        help="folder to write results into (default: "
                             "benchmarks/results/cpu2-outage of this checkout)")
    add_numbers(parser, [("--events", int, 16000,
                          "events per dataset (2 datasets x 2 files, 16 chunks)")])
    return parser


class MarkedJetTagging(JetTaggingProcessor):
    """The example analysis; each finished chunk leaves a file in ``marks``."""

    def __init__(self, *args: Any, marks: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.marks = marks

    def process(self, events: Any) -> dict[str, Any]:
        output = super().process(events)
        Path(self.marks, f"{os.getpid()}-{time.monotonic_ns()}").touch()
        return output


def _run(client: Any, fileset: dict[str, Any], analysis: Any, chunksize: int) -> dict[str, Any]:
    runner = processor.Runner(executor=processor.DaskExecutor(client=client, status=False,
                                                              retries=0),
                              schema=QuietSchema, chunksize=chunksize)
    started = time.perf_counter()
    stats = runner(fileset, treename="Events", processor_instance=analysis)["inference"]
    return {"wall_s": round(time.perf_counter() - started, 2),
            "rows": sum(s.rows for s in stats.values()),
            "fallback_rows": sum(s.fallback_rows for s in stats.values()),
            "incidents": stats.incidents.totals()}


def _kill_after_chunks(server: Any, marks: str, stop: threading.Event, killed: list) -> None:
    """In a thread: SIGKILL ``server`` once KILL_AFTER_CHUNKS chunks are done."""
    while not stop.is_set():
        if len(os.listdir(marks)) >= KILL_AFTER_CHUNKS:
            os.kill(server.pid, signal.SIGKILL)
            killed.append(time.perf_counter())
            return
        stop.wait(0.01)


def _runs(fileset: dict[str, Any], chunksize: int, work: Path,
          progress: Callable[[str], None]) -> dict[str, Any]:
    """``healthy``, ``killed`` and ``cpu_only`` on one Dask cluster of 2 workers."""
    from distributed import Client, LocalCluster

    from coffea_sonic.server import LocalTritonServer
    from coffea_sonic.server.launcher import free_port

    results: dict[str, Any] = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=120)
        for label in ("healthy", "killed", "cpu_only"):
            marks = tempfile.mkdtemp(dir=work)
            server = None if label == "cpu_only" else LocalTritonServer(
                models=MODELS, device="cpu").start()
            address = server.grpc_address if server else f"127.0.0.1:{free_port()}"
            stop, killed = threading.Event(), []
            if label == "killed":
                threading.Thread(target=_kill_after_chunks, args=(server, marks, stop, killed),
                                 name="outage-killer", daemon=True).start()
            try:
                analysis = MarkedJetTagging(f"triton+grpc://{address}", marks=marks,
                                            fallback="cpu")
                results[label] = _run(client, fileset, analysis, chunksize)
            finally:
                stop.set()
                if server is not None:
                    server.stop()
            progress(f"{label}: {results[label]}")
            if label == "killed" and not killed:
                raise RuntimeError("outage: the server was not killed mid-run; use more --events")
    return results


def measure(events: int, output: str, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """The three runs over ``events`` events per dataset; writes outage.json and outage.png into
    ``output`` and returns the record."""
    from coffea_sonic.bench.machine import cpu_model
    from coffea_sonic.data.synthetic import write_sample
    from coffea_sonic.model_options import DEFAULT_CONNECT_TIMEOUT_S

    output_dir = Path(output)
    output_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="outage-bench-"))
    files = write_sample(work / "sample", events=events, files=2, seed=7)
    fileset = {name: {"files": {p: "Events" for p in paths}} for name, paths in files.items()}
    results = _runs(fileset, events // 2 // 4, work, progress)  # 4 chunks per file, 16 in all
    healthy, killed = results["healthy"]["wall_s"], results["killed"]["wall_s"]
    goal = 2 * healthy + DEFAULT_CONNECT_TIMEOUT_S
    record = {
        "benchmark": "outage", "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "load": os.getloadavg()},
        "command": f"python benchmarks/outage_bench.py --events {events} -o {output}",
        "chunks": 16, "workers": 2, "kill_after_chunks": KILL_AFTER_CHUNKS,
        "runs": results, "killed_over_healthy": round(killed / healthy, 2),
        "goal_s": round(goal, 1), "goal_met": killed <= goal}
    (output_dir / "outage.json").write_text(json.dumps(record, indent=1))
    _plot(results, goal, output_dir / "outage.png")
    return record


def _plot(results: dict[str, Any], goal: float, path: Path) -> None:
    from coffea_sonic.bench.files import pyplot, save_figure

    labels = list(results)
    figure, axis = pyplot().subplots(figsize=(6, 3.2))
    axis.bar(labels, [results[label]["wall_s"] for label in labels],
             color=["#3b7dd8", "#d8763b", "#888888"])
    axis.axhline(goal, color="black", linestyle="--", linewidth=1,
                 label="goal: 2 x healthy + connect timeout")
    axis.set_ylabel("wall time of the 16-chunk run [s]")
    axis.set_title("server SIGKILLed after 3 chunks, fallback='cpu'")
    axis.legend(loc="upper left", fontsize=8)
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    """Measure; print the three runs and the goal."""
    args = build_parser().parse_args(argv)
    record = measure(args.events, args.output)
    print(f"killed / healthy = {record['killed_over_healthy']}x; goal <= {record['goal_s']} s: "
          f"{'met' if record['goal_met'] else 'NOT met'}; written to {args.output}/outage.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
