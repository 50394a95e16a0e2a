"""Rows/s and GB/s of tensor payload per transport, client processes and server, one run.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from .clients import ClientPool, ready_then_start
from .files import cell, pyplot, save_figure, table, write_report
from .machine import load_lines, machine_label, stamped
from .modes import row_bytes as model_row_bytes
from .report import format_rate
from .slice_model import SINK_NAME, write_payload_sink

__all__ = ["Entry", "KINDS", "PLANS", "TransportBench", "label", "markdown", "replot", "row_bytes",
           "run_transport_bench", "table_row", "transport_task", "write_transport_report"]

logger = logging.getLogger(__name__)

#: what each kind is
KINDS: dict[str, str] = {
    "tritonclient": "stock tritonclient.grpc infer()",
    "grpc": "GrpcTransport", "http": "HttpTransport", "shm": "SystemShmTransport",
    "cuda": "CudaShmTransport (inputs on the GPU)", "local": "in-process engine"}
#: kinds that need a GPU (left out of a run on a CPU server)
GPU_KINDS = ("cuda",)
#: kinds that answer in the calling thread: one request at a time whatever ``in_flight`` says
BLOCKING_KINDS = ("tritonclient", "local")


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


@dataclass
class TransportBench:
    """The run: a plan (or some of its kinds), the server's device and knobs, the window length."""

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

    def entries(self, device: str = "cpu") -> list[Entry]:
        """The plan's entries this run measures (GPU kinds only on a GPU)."""
        if self.plan not in PLANS:
            raise ValueError(f"plan must be one of {', '.join(PLANS)}, not {self.plan!r}")
        return [entry._replace(in_flight=1) if entry.kind in BLOCKING_KINDS else entry
                for entry in PLANS[self.plan]
                if (not self.kinds or entry.kind in self.kinds)
                and (device == "gpu" or entry.kind not in GPU_KINDS)]


def _inputs_model(model: str) -> str:
    return "emtrk_cnn" if model == SINK_NAME else model  # the sink takes emtrk_cnn's rows


def row_bytes(model: str) -> int:
    """Input bytes of one row of ``model`` (the sink's are emtrk_cnn's)."""
    return model_row_bytes(_inputs_model(model))


def _finished(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def _stock_client(model: str, address: str, specs: tuple) -> Callable[[dict], Future]:
    """``tritonclient.grpc``'s blocking ``infer``: answers in the calling thread."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(address)

    def submit(inputs: dict) -> Future:
        tensors = []
        for name, array in inputs.items():
            tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        answer = client.infer(model, tensors)
        return _finished({spec.name: answer.as_numpy(spec.name) for spec in specs})

    return submit


def _make_client(task: dict) -> tuple[Callable[[dict], Future], Any]:
    """``submit(inputs) -> Future`` of ``task["kind"]`` for ``task["model"]``, and the transport
    behind it (None for the blocking kinds)."""
    from .. import zoo
    from ..core.tensors import TensorInfo

    kind, model = task["kind"], task["model"]
    specs = ((TensorInfo("first", "FP32", (1,)),) if model == SINK_NAME
             else zoo.declared_info(model).outputs)
    if kind == "tritonclient":
        return _stock_client(model, task["grpc"], specs), None
    if kind == "local":
        from ..engines import CpuEngine, GpuEngine

        if model == SINK_NAME:
            raise ValueError(f"{SINK_NAME} is a server-side model: no in-process engine runs it")
        engine = GpuEngine(model) if task["device"] == "gpu" else CpuEngine(model)
        return (lambda inputs: _finished(engine(inputs))), None
    if kind not in KINDS:
        raise ValueError(f"transport kind must be one of {', '.join(KINDS)}, not {kind!r}")
    from ..core.endpoint import ServerSettings
    from ..transport.base import InferRequest
    from ..transport.registry import open_transport

    transport = open_transport(ServerSettings(task["http"], protocol="http") if kind == "http"
                               else ServerSettings(task["grpc"]), kind)

    def submit(inputs: dict) -> Future:
        rows = int(next(iter(inputs.values())).shape[0])
        return transport.submit(InferRequest(model, "", inputs, specs, rows=rows, timeout_s=120))

    return submit, transport


def _timed_window(submit: Callable[[dict], Future], inputs: dict, task: dict,
                  start_at: float) -> dict:
    """Requests back to back with ``in_flight`` outstanding until ``start_at + duration``."""
    end = start_at + task["duration"]
    pending: deque = deque()
    requests, submit_s, latencies = 0, 0.0, []
    while True:
        now = time.time()
        if now >= end and not pending:
            break
        if now < end and len(pending) < task["in_flight"]:
            began = time.perf_counter()
            pending.append((submit(inputs), now))
            submit_s += time.perf_counter() - began
            continue
        handle, sent = pending.popleft()
        handle.result()
        finished = time.time()
        if finished <= end:
            requests += 1
            latencies.append(finished - sent)
    return {"rows": requests * task["rows"], "requests": requests, "submit_s": submit_s,
            "latency_ms_p50": 1e3 * float(np.median(latencies)) if latencies else None}


def transport_task(task: dict, tasks: Any, control: Any, cache: dict) -> dict:
    """A client process' window (see :class:`~coffea_sonic.bench.clients.ClientPool`)."""
    from .. import zoo

    key = (task["kind"], task["model"], task["grpc"])
    if key not in cache:
        cache[key] = _make_client(task)
    submit, transport = cache[key]
    inputs: Any = zoo.example_inputs(_inputs_model(task["model"]), task["rows"], seed=1)
    if task["kind"] == "cuda":
        import torch

        inputs = {name: torch.from_numpy(array).cuda() for name, array in inputs.items()}
    for _ in range(2):  # connections, shared-memory regions, kernels
        submit(inputs).result()
    start_at = ready_then_start(tasks, control)
    return {**_timed_window(submit, inputs, task, start_at),
            "stats": dict(getattr(transport, "stats", {}) or {})}


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


def _measure(pool: ClientPool, server: Any, entry: Entry, device: str, duration: float,
             gpu: Any) -> dict:
    """The record of ``entry`` (RuntimeError if a client process died or hung)."""
    task = {**entry._asdict(), "duration": duration, "device": device,
            "grpc": server.grpc_address, "http": server.http_address}
    window = pool.measure(task, entry.procs, gpu=gpu, model=entry.model,
                          server=None if entry.kind == "local" else server.grpc_address)
    return _record(entry, window["results"], duration, gpu_util=window["gpu_percent"],
                   server=window["server_profile"] or {})


def _measure_all(server: Any, entries: list[Entry], device: str, duration: float,
                 records: list[dict]) -> None:
    """Every entry once on ``server``; a crashed client pool is replaced and the run goes on."""
    from .probes import GpuUtilisation

    size = max(entry.procs for entry in entries)
    pool = ClientPool(size, transport_task)
    try:
        with GpuUtilisation() as gpu:
            for entry in entries:
                try:
                    record = _measure(pool, server, entry, device, duration, gpu)
                except RuntimeError as error:
                    logger.error("%s: %s", entry, error)
                    record = {**entry._asdict(), "errors": [str(error)]}
                    pool.close()
                    pool = ClientPool(size, transport_task)
                records.append(record)
                logger.info("%s: %s rows/s, %s GB/s", entry, record.get("rows_per_s"),
                            record.get("gb_per_s"))
    finally:
        pool.close()


def run_transport_bench(config: TransportBench) -> dict:
    """Start the server, measure every entry of the plan, return the report (JSON-ready)."""
    from ..server import LocalTritonServer, write_repository
    from ..server.launcher import GPU_INSTANCES, gpu_available

    device = config.device or ("gpu" if gpu_available() else "cpu")
    instances = config.instances or (GPU_INSTANCES if device == "gpu" else 1)
    entries = config.entries(device)
    if not entries:
        raise ValueError(f"plan {config.plan!r} has no entry of kinds {list(config.kinds)}")
    models = sorted({entry.model for entry in entries} - {SINK_NAME})
    fields = {**asdict(config), "device": device, "instances": instances, "records": []}
    with stamped(**fields) as report, \
            tempfile.TemporaryDirectory(prefix="bench-transport-",
                                        ignore_cleanup_errors=True) as scratch:
        if models:
            write_repository(Path(scratch), models, backend="python", device=device,
                             instances=instances, staging=config.staging,
                             gpu_input_tensors=config.gpu_inputs and device == "gpu")
        repository = write_payload_sink(Path(scratch), instances=2)
        with LocalTritonServer(repository=repository, device=device) as server:
            _measure_all(server, entries, device, config.duration, report["records"])
    return report


def _kind(record: dict) -> str:
    return f"{record['phase']}: {record['kind']}" if record.get("phase") else record["kind"]


def label(record: dict) -> str:
    """``kind rows x procs x in-flight`` (with an older study's phase in front)."""
    return f"{_kind(record)} {record['rows']} rows, {record['procs']} x {record['in_flight']}"


def table_row(record: dict) -> list:
    """One window's cells: rates, client and server times (an error where it failed).

    >>> table_row({"kind": "shm", "model": "payload_sink", "rows": 2048, "procs": 1,
    ...     "in_flight": 2, "rows_per_s": 390000, "gb_per_s": 3.594, "client_submit_ms": 1.2,
    ...     "latency_ms_p50": 5.0, "gpu_util": None, "server": {"queue_ms": 0.1,
    ...     "compute_input_ms": 2.0, "compute_infer_ms": 1.0, "compute_output_ms": 0.1,
    ...     "avg_batch": 2048.0}})
    ['shm', 'payload_sink', 2048, '1 x 2', '390 k', 3.594, '–', '1.2', '5', '0.1 / 2 / 1 / 0.1', 2048.0]
    """
    if not record.get("rows_per_s"):
        return [record.get("kind"), record.get("model"), record.get("rows"),
                f"ERROR: {'; '.join(record['errors'])[:300]}"]
    server = record.get("server") or {}
    profile = " / ".join(cell(server.get(f"{part}_ms"), ".3g") for part in
                         ("queue", "compute_input", "compute_infer", "compute_output"))
    return [_kind(record), record["model"], record["rows"],
            f"{record['procs']} x {record['in_flight']}", format_rate(record["rows_per_s"]),
            record["gb_per_s"], cell(record.get("gpu_util"), ".3g"),
            cell(record.get("client_submit_ms"), ".3g"), cell(record.get("latency_ms_p50"), ".3g"),
            profile if server else "–", server.get("avg_batch", "–")]


def _where(report: dict) -> str:
    machine = report.get("machine", {})
    return (f"{machine_label(machine)} ({machine.get('cpu_model', '?')}, "
            f"{machine.get('cpu_cores', '?')} cores), {machine.get('date', '')[:10]}")


def markdown(report: dict) -> str:
    """The machine, load, command and one row per window (failed windows with their error)."""
    lines = [f"# Transports: rows/s and GB/s per window, {_where(report)}", "",
             f"device {report.get('device')}, {report.get('instances')} model instance(s), "
             f"staging {report.get('staging')}, "
             f"{report.get('duration', report.get('duration_s'))} s per window", "",
             *load_lines(report),
             *table(["transport", "model", "rows/request", "procs x in flight", "rows/s", "GB/s",
                     "GPU %", "client submit ms", "p50 ms", "server queue / in / infer / out ms",
                     "avg batch"], (table_row(record) for record in report["records"]
                                    if record.get("rows_per_s") or record.get("errors")))]
    return "\n".join(lines) + "\n"


def _panel(axis: Any, records: list[dict], model: str) -> None:
    """Bars of one model's windows: GB/s for the sink, else rows/s (x in-process)."""
    mine = [record for record in records if record["model"] == model]
    sink = model == SINK_NAME
    values = [record["gb_per_s"] if sink else record["rows_per_s"] for record in mine]
    axis.barh(range(len(mine)), values,
              color=["#b0b0b0" if r["kind"] in BLOCKING_KINDS else "#3b75af" for r in mine])
    for index, record in enumerate(mine):
        local = next((other["rows_per_s"] for other in records if other["kind"] == "local"
                      and (other["model"], other["rows"]) == (model, record["rows"])), None)
        text = f"{record['gb_per_s']:.2f} GB/s" if sink else format_rate(record["rows_per_s"])
        if local and record["kind"] != "local":
            text += f", {record['rows_per_s'] / local:.2f}x in-process"
        if record.get("gpu_util") is not None:
            text += f", GPU {record['gpu_util']:.0f}%"
        axis.text(values[index], index, " " + text, va="center", fontsize=7)
    axis.set_yticks(range(len(mine)), [label(record) for record in mine], fontsize=7)
    axis.invert_yaxis()
    axis.margins(x=0.3)  # room for the labels right of the bars
    axis.set_xlabel("tensor payload GB/s (transport-bound model)" if sink else "rows/s")
    axis.set_title(model, fontsize=9)


def _write(report: dict, output: Path, tag: str) -> dict[str, Path]:
    """``results-TAG.md`` and ``transport-TAG.png``: one panel per model of the windows."""
    output.mkdir(parents=True, exist_ok=True)
    (output / f"results-{tag}.md").write_text(markdown(report))
    # an older study's ``verify`` rows and failed windows have no rate
    records = [record for record in report["records"] if record.get("rows_per_s")]
    models = sorted({record["model"] for record in records}, key=lambda m: (m != SINK_NAME, m))
    figure, axes = pyplot().subplots(len(models) or 1, 1, squeeze=False,
                                     figsize=(9, 1.2 + 0.35 * max(len(records), 2)))
    for axis, model in zip(axes[:, 0], models):
        _panel(axis, records, model)
    return {"markdown": output / f"results-{tag}.md",
            "figure": save_figure(figure, output / f"transport-{tag}.png",
                                  f"{_where(report)}; device {report.get('device')}")}


def write_transport_report(report: dict, output: str | Path, tag: str) -> dict[str, Path]:
    """``results-TAG.json``, ``results-TAG.md`` and ``transport-TAG.png`` in ``output``."""
    write_report(report, output, f"results-{tag}", markdown)
    return {"json": Path(output) / f"results-{tag}.json", **_write(report, Path(output), tag)}


def replot(source: str | Path, output: str | Path) -> dict[str, Path]:
    """The table and figure of a written ``results-TAG.json``, into ``output`` (same TAG)."""
    report = json.loads(Path(source).read_text())
    return _write(report, Path(output), Path(source).stem.removeprefix("results-"))
