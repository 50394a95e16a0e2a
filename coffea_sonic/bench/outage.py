"""A server SIGKILLed mid-run with ``fallback="cpu"`` (``coffea-sonic bench outage``).
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from coffea import processor
from coffea.nanoevents import NanoAODSchema

from ..data.synthetic import write_sample
from ..examples.jet_tagging import JetTaggingProcessor
from ..model_options import DEFAULT_CONNECT_TIMEOUT_S
from ..server import LocalTritonServer
from ..server.launcher import free_port
from .files import pyplot, save_figure
from .machine import cpu_model

logger = logging.getLogger(__name__)

MODELS = ["jet_tagger", "particlenet_lite"]
QuietSchema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
KILL_AFTER_CHUNKS = 3


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


def _kill_after_chunks(server: LocalTritonServer, marks: str, stop: threading.Event,
                       killed: list) -> None:
    """In a thread: SIGKILL ``server`` once KILL_AFTER_CHUNKS chunks are done."""
    while not stop.is_set():
        if len(os.listdir(marks)) >= KILL_AFTER_CHUNKS:
            os.kill(server.pid, signal.SIGKILL)
            killed.append(time.perf_counter())
            return
        stop.wait(0.01)


def measure(events: int, output: str, progress: Any = None) -> dict[str, Any]:
    """The three runs over ``events`` events per dataset; writes outage.json and outage.png into
    ``output`` and returns the record."""
    from distributed import Client, LocalCluster

    progress = progress or logger.info
    output_dir = Path(output)
    output_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="outage-bench-"))
    files = write_sample(work / "sample", events=events, files=2, seed=7)
    fileset = {name: {"files": {p: "Events" for p in paths}} for name, paths in files.items()}
    chunksize = events // 2 // 4  # 4 chunks per file, 16 in all
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
    healthy, killed = results["healthy"]["wall_s"], results["killed"]["wall_s"]
    goal = 2 * healthy + DEFAULT_CONNECT_TIMEOUT_S
    record = {
        "benchmark": "outage", "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "load": os.getloadavg()},
        "command": f"coffea-sonic bench outage --events {events} -o {output}",
        "chunks": 16, "workers": 2, "kill_after_chunks": KILL_AFTER_CHUNKS,
        "runs": results, "killed_over_healthy": round(killed / healthy, 2),
        "goal_s": round(goal, 1), "goal_met": killed <= goal}
    (output_dir / "outage.json").write_text(json.dumps(record, indent=1))
    _plot(results, goal, output_dir / "outage.png")
    return record


def _plot(results: dict[str, Any], goal: float, path: Path) -> None:
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
