"""Rows/s and GB/s of tensor payload per transport, client processes and server, one run.

``coffea-sonic bench transport`` runs it (:mod:`coffea_sonic.bench.commands.transport`). One real
tritonserver (the embedded one, or the GPU machine's through the ``TRITON*`` environment of
``triton-gpu-env.sh``) serves the zoo models of the plan (python backend, the package's
model.py) and ``payload_sink`` (:func:`~coffea_sonic.bench.slice_model.write_payload_sink`:
emtrk_cnn's input, one float back, no compute: a request's time is the transport's). Every entry
of the plan (:class:`Entry`: kind, model, rows per request, client processes, requests in flight
per process) gets one window of ``duration`` seconds: ``procs`` spawned client processes
(:mod:`.transport_clients`) start together and send back to back; rows/s = rows answered inside
the window, summed; GB/s = input bytes of those rows. Around each served window: Triton's
statistics (queue, compute input / infer / output per request, average batch, busy fraction;
:func:`~coffea_sonic.bench.probes.server_profile`) and GPU utilisation (``nvidia-smi``,
:class:`~coffea_sonic.bench.probes.GpuUtilisation`).

>>> [entry.kind for entry in PLANS["quick"]]
['local', 'tritonclient', 'grpc', 'http', 'shm', 'shm']
>>> TransportBench(plan="quick", kinds=("tritonclient",)).entries()  # it blocks: 1 in flight
[Entry(kind='tritonclient', model='payload_sink', rows=512, procs=1, in_flight=1)]
>>> TransportBench(plan="quick", kinds=("grpc", "shm")).entries()[0]
Entry(kind='grpc', model='payload_sink', rows=2048, procs=1, in_flight=2)
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from .clients import ClientPool
from .machine import machine_info
from .reference_run import uptime_line
from .slice_model import SINK_NAME, write_payload_sink
from .transport_clients import row_bytes, transport_task

__all__ = ["Entry", "PLANS", "TransportBench", "run_transport_bench"]

logger = logging.getLogger(__name__)


class Entry(NamedTuple):
    """One window: ``procs`` processes of ``kind`` sending ``rows``-row requests to ``model``."""

    kind: str
    model: str
    rows: int
    procs: int = 1
    in_flight: int = 2


_SINK = SINK_NAME
#: the plans: ``quick`` (a look, seconds), ``cpu`` (the 2-core box), ``gpu`` (a GPU machine)
PLANS: dict[str, list[Entry]] = {
    "quick": [
        Entry("local", "jet_tagger", 4096, 1, 1),
        Entry("tritonclient", _SINK, 512, 1, 1),
        Entry("grpc", _SINK, 2048, 1, 2),
        Entry("http", _SINK, 512, 1, 2),
        Entry("shm", _SINK, 2048, 1, 2),
        Entry("shm", "jet_tagger", 4096, 1, 2),
    ],
    "cpu": [
        Entry("local", "jet_tagger", 16384, 1, 1),
        Entry("local", "emtrk_cnn", 256, 1, 1),
        Entry("tritonclient", "jet_tagger", 16384, 1, 1),
        Entry("grpc", "jet_tagger", 16384, 1, 2),
        Entry("shm", "jet_tagger", 16384, 1, 2),
        Entry("shm", "jet_tagger", 16384, 2, 2),
        Entry("tritonclient", "emtrk_cnn", 256, 1, 1),
        Entry("shm", "emtrk_cnn", 256, 1, 2),
        Entry("tritonclient", _SINK, 2048, 1, 1),
        *[Entry(kind, _SINK, 2048, 1, 2) for kind in ("grpc", "http", "shm")],
        *[Entry(kind, _SINK, 512, 1, 4) for kind in ("grpc", "http", "shm")],
        *[Entry(kind, _SINK, 2048, 2, 2) for kind in ("grpc", "http", "shm")],
    ],
    "gpu": [
        Entry("local", "emtrk_cnn", 2048, 1, 1),
        Entry("local", "jet_tagger", 65536, 1, 1),
        Entry("tritonclient", "emtrk_cnn", 2048, 1, 1),
        Entry("tritonclient", "emtrk_cnn", 2048, 8, 1),
        *[Entry(kind, "emtrk_cnn", 2048, procs, 2)
          for kind, procs in (("grpc", 8), ("http", 8), ("shm", 1), ("shm", 8), ("shm", 12),
                              ("cuda", 1), ("cuda", 8))],
        Entry("tritonclient", "jet_tagger", 16384, 8, 1),
        *[Entry(kind, "jet_tagger", 65536, 12, 2) for kind in ("grpc", "shm")],
        Entry("tritonclient", _SINK, 2048, 1, 1),
        *[Entry(kind, _SINK, rows, 1, 4) for kind in ("grpc", "http", "shm")
          for rows in (256, 512, 2048)],
    ],
}

#: kinds that need a GPU (left out of a run on a CPU server)
GPU_KINDS = ("cuda",)
#: kinds that answer in the calling thread: one request at a time whatever ``in_flight`` says
BLOCKING_KINDS = ("tritonclient", "local")


@dataclass
class TransportBench:
    """The run: a plan (or one's kinds), the server's device and knobs, the window length."""

    plan: str = "cpu"
    #: keep only these kinds of the plan (empty: all)
    kinds: tuple[str, ...] = ()
    #: "cpu", "gpu" or None (a GPU if one is visible)
    device: str | None = None
    duration: float = 4.0
    #: model instances per device (None: the server's default)
    instances: int | None = None
    staging: str = "pinned"
    gpu_inputs: bool = False

    def resolved_device(self) -> str:
        from ..server.launcher import gpu_available

        return self.device or ("gpu" if gpu_available() else "cpu")

    def resolved_instances(self, device: str) -> int:
        from ..server.launcher import GPU_INSTANCES

        return self.instances or (GPU_INSTANCES if device == "gpu" else 1)

    def entries(self, device: str = "cpu") -> list[Entry]:
        """The plan's entries this run measures (GPU kinds only on a GPU)."""
        if self.plan not in PLANS:
            raise ValueError(f"plan must be one of {', '.join(PLANS)}, not {self.plan!r}")
        return [entry._replace(in_flight=1) if entry.kind in BLOCKING_KINDS else entry
                for entry in PLANS[self.plan]
                if (not self.kinds or entry.kind in self.kinds)
                and (device == "gpu" or entry.kind not in GPU_KINDS)]


def write_bench_repository(root: Path, models: list[str], device: str, instances: int,
                           config: TransportBench) -> Path:
    """The zoo ``models`` (python backend, the package's model.py) and ``payload_sink``."""
    from ..server import write_repository

    if models:
        write_repository(root, models, backend="python", device=device, instances=instances,
                         staging=config.staging,
                         gpu_input_tensors=config.gpu_inputs and device == "gpu")
    return write_payload_sink(root, instances=2)


class _Window:
    """One entry on the running server: its client processes, statistics and GPU samples."""

    def __init__(self, server: Any, device: str, duration: float, gpu: Any) -> None:
        from .probes import statistics_transport

        self.server, self.device, self.duration, self.gpu = server, device, duration, gpu
        self.statistics = statistics_transport(server.grpc_address)

    def measure(self, pool: ClientPool, entry: Entry) -> dict:
        """The record of ``entry`` (RuntimeError if a client process died or hung)."""
        from .probes import run_gpu_mean, server_profile, server_statistics

        task = {**entry._asdict(), "duration": self.duration, "device": self.device,
                "grpc": self.server.grpc_address, "http": self.server.http_address}
        served = entry.kind != "local"
        before = server_statistics(self.statistics, entry.model) if served else None
        start, results = pool.run(task, entry.procs)
        after = server_statistics(self.statistics, entry.model) if served else None
        return _record(entry, results, self.duration,
                       gpu_util=run_gpu_mean(self.gpu, start, start + self.duration),
                       server=server_profile(before, after, self.duration) if served else {})


def _record(entry: Entry, results: list[dict], duration: float, **measured: Any) -> dict:
    """One row of the report from the client processes' results."""
    rows = sum(result.get("rows", 0) for result in results)
    requests = sum(result.get("requests", 0) for result in results)
    return {**entry._asdict(),
            "rows_per_s": round(rows / duration),
            "gb_per_s": round(rows * row_bytes(entry.model) / duration / 1e9, 3),
            "requests": requests,
            "client_submit_ms": round(1e3 * sum(r.get("submit_s", 0.0) for r in results)
                                      / max(requests, 1), 3),
            "latency_ms_p50": results[0].get("latency_ms_p50") if results else None,
            "transport_stats": results[0].get("stats", {}) if results else {},
            "errors": [result["error"] for result in results if "error" in result],
            **measured}


def _measure_all(server: Any, entries: list[Entry], device: str, config: TransportBench,
                 records: list[dict]) -> None:
    """Every entry once on ``server``; a crashed client pool is replaced and the run goes on."""
    from .probes import GpuUtilisation

    pool_size = max(entry.procs for entry in entries)
    pool = ClientPool(pool_size, transport_task)
    try:
        with GpuUtilisation() as gpu:
            window = _Window(server, device, config.duration, gpu)
            for entry in entries:
                try:
                    record = window.measure(pool, entry)
                except RuntimeError as error:
                    logger.error("%s: %s", entry, error)
                    record = {**entry._asdict(), "errors": [str(error)]}
                    pool.close()
                    pool = ClientPool(pool_size, transport_task)
                records.append(record)
                logger.info("%s: %s rows/s, %s GB/s", entry, record.get("rows_per_s"),
                            record.get("gb_per_s"))
    finally:
        pool.close()


def run_transport_bench(config: TransportBench) -> dict:
    """Start the server, measure every entry of the plan, return the report (JSON-ready)."""
    from ..server import LocalTritonServer

    device = config.resolved_device()
    instances = config.resolved_instances(device)
    entries = config.entries(device)
    if not entries:
        raise ValueError(f"plan {config.plan!r} has no entry of kinds {list(config.kinds)}")
    records: list[dict] = []
    report = {**asdict(config), "machine": machine_info(), "command": " ".join(sys.argv),
              "uptime_before": uptime_line(), "device": device, "instances": instances,
              "records": records}
    models = sorted({entry.model for entry in entries} - {SINK_NAME})
    scratch = Path(tempfile.mkdtemp(prefix="bench-transport-"))
    try:
        repository = write_bench_repository(scratch, models, device, instances, config)
        began = time.time()
        with LocalTritonServer(repository=repository, device=device) as server:
            logger.info("server ready in %.1f s (%s)", time.time() - began, server.grpc_address)
            _measure_all(server, entries, device, config, records)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report["uptime_after"] = uptime_line()
    return report
