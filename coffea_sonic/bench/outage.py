"""``coffea-sonic bench outage``: a server SIGKILLed mid-run, with ``fallback="cpu"``: the run's wall time against a healthy run.

The example analysis (``JetTaggingProcessor``: jet_tagger and particlenet_lite) runs under
``processor.Runner`` + ``DaskExecutor`` (a LocalCluster of 2 single-threaded worker processes)
over 16 chunks, at the defaults a user gets plus ``fallback="cpu"``, three ways, in one process,
one after the other:

* ``healthy``: the server answers every chunk;
* ``killed``: the server is SIGKILLed once three chunks are done; the rest fall back;
* ``cpu_only``: no server at all (every row by the fallback), for scale.

:func:`measure` runs them and writes ``outage.json`` and ``outage.png``
(``coffea-sonic bench outage``). The goal: ``killed`` at most twice ``healthy`` plus the connect
timeout (10 s).

>>> MarkedJetTagging("triton+grpc://127.0.0.1:8001", marks="/tmp").marks
'/tmp'
"""

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


def _run(client: Any, fileset: dict[str, Any], analysis: Any, chunksize: int) -> tuple[Any, float]:
    runner = processor.Runner(executor=processor.DaskExecutor(client=client, status=False,
                                                              retries=0),
                              schema=QuietSchema, chunksize=chunksize)
    started = time.perf_counter()
    output = runner(fileset, treename="Events", processor_instance=analysis)
    return output, time.perf_counter() - started


def _killer(server: LocalTritonServer, marks: str, stop: threading.Event) -> dict[str, float]:
    """Kill ``server`` once KILL_AFTER_CHUNKS chunks are done (in a thread); when it happened."""
    when: dict[str, float] = {}

    def watch() -> None:
        while not stop.is_set():
            if len(os.listdir(marks)) >= KILL_AFTER_CHUNKS:
                os.kill(server.pid, signal.SIGKILL)
                when["killed"] = time.perf_counter()
                return
            stop.wait(0.01)

    threading.Thread(target=watch, name="outage-killer", daemon=True).start()
    return when


def _summary(output: Any, wall_s: float) -> dict[str, Any]:
    stats = output["inference"]
    rows = sum(s.rows for s in stats.values())
    return {"wall_s": round(wall_s, 2), "rows": rows,
            "fallback_rows": sum(s.fallback_rows for s in stats.values()),
            "incidents": stats.incidents.totals()}


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
            stop = threading.Event()
            when = _killer(server, marks, stop) if label == "killed" else {}
            try:
                analysis = MarkedJetTagging(f"triton+grpc://{address}", marks=marks,
                                            fallback="cpu")
                output, wall_s = _run(client, fileset, analysis, chunksize)
            finally:
                stop.set()
                if server is not None:
                    server.stop()
            results[label] = _summary(output, wall_s)
            progress(f"{label}: {results[label]}")
            assert label != "killed" or "killed" in when, "the server was not killed mid-run"
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
