"""``coffea-sonic bench e2e``: the analysis end to end on this machine, every way to infer.

One sample, one worker count ``W``, the physics-mode analysis of :mod:`coffea_sonic.bench.e2e`
(``jet_tagger`` and the trained ``particlenet`` on every selected jet, ``deepmet`` on every event)
run by ``processor.Runner`` on a local Dask cluster, once per way of running its inference:

* ``cpu``: in-process onnxruntime in every worker, one thread each (the all-CPU job);
* ``gpu-local``: in-process torch in every worker, the workers spread over this machine's GPUs
  (every worker holds its own CUDA context and copies);
* ``served-<k>gpu``: one embedded tritonserver using the first ``k`` GPUs
  (``LocalTritonServer(device="gpu", gpus=range(k))``), every worker a default ``TritonModel``.

Per run: events/s, speedup over ``cpu``, the inference share (time the workers waited for
inference / worker time), mean utilisation of the GPUs in use (nvidia-smi), the workers' memory
limit (``make_cluster``'s default, from this machine) and their peak resident memory, and, for
served runs, what the SONIC scaling model predicts: ``p`` and ``t_CPU`` from the ``cpu`` run,
``t_GPU`` (GPU-seconds per event, from utilisation) and ``t_latency`` from the first served run;
the prediction for the other GPU counts and worker counts is then a true prediction.

The sample is written by several processes at once (one file each), so a million events take
seconds on a 16-core machine rather than minutes.

>>> gpu_sets([1, 2, 4], available=2)
[[0], [0, 1]]
>>> inputs = {"p": 0.8, "t_cpu": 1e-3, "t_gpu": 1e-4, "t_latency": 5e-5}
>>> [round(predicted_events_per_s(inputs, workers, 1)) for workers in (2, 10)]  # saturated at 10
[5714, 10000]
>>> round(predicted_events_per_s(inputs, 10, 2))  # two GPUs
20000
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Sequence

from ..errors import ConfigurationError
from .files import pyplot, save_figure, write_report
from .e2e import E2E_MODELS, InProcessJetTagging, _run_once, write_sample_parallel
from .scaling import ScalingModel

logger = logging.getLogger(__name__)

__all__ = ["gpu_sets", "predicted_events_per_s", "run_machine_e2e", "write_sample_parallel"]


def gpu_sets(counts: Sequence[int], available: int) -> list[list[int]]:
    """The GPU index lists of the served runs: the first ``k`` GPUs for each ``k`` that exists."""
    return [list(range(count)) for count in sorted(set(counts)) if 1 <= count <= available]


def predicted_events_per_s(inputs: dict, workers: int, n_gpu: int) -> float:
    """Events/s the SONIC scaling model predicts for ``workers`` workers sharing ``n_gpu`` GPUs."""
    model = ScalingModel(t_gpu=max(inputs["t_gpu"], 1e-12), t_latency=inputs["t_latency"],
                         p=inputs["p"], t_cpu=inputs["t_cpu"], n_gpu=n_gpu)
    return model.throughput(workers)


def _scaling_inputs(cpu: dict, served: dict) -> dict | None:
    if cpu is None or served is None or served.get("gpu_percent") is None:
        return None
    p = min(max(cpu["inference_share"], 0.0), 1.0)
    t_cpu = cpu["wall_s"] * cpu["workers"] / cpu["events"]
    # GPU-seconds per event: the GPUs' busy fraction over the run, times their number
    t_gpu = served["gpu_percent"] / 100.0 * served["wall_s"] * served["gpus"] / served["events"]
    t_served = served["wall_s"] * served["workers"] / served["events"]
    return {"p": p, "t_cpu": t_cpu, "t_gpu": t_gpu,
            "t_latency": max(0.0, t_served - (1 - p) * t_cpu - t_gpu),
            "from": f"cpu and served-{served['gpus']}gpu runs"}


def run_machine_e2e(events: int, workers: int, *, gpus: Sequence[int] = (1, 2, 4),
                    local_gpu: bool = True, chunksize: int | None = None,
                    server_options: dict | None = None,
                    progress: Callable[[str], None] | None = None) -> dict:
    """Run the analysis in-process on CPU, in-process on GPU and served on 1..N GPUs (module doc)."""
    from ..server import LocalTritonServer
    from ..server.launcher import gpu_count
    from .e2e import _quiet_dask, _restore_warnings, _silence_tau_warnings
    from .probes import GpuUtilisation

    if events < 1 or workers < 1:
        raise ConfigurationError(f"need events >= 1 and workers >= 1, not {events} and {workers}")
    progress = progress or (lambda message: logger.info("%s", message))
    _quiet_dask()
    available = gpu_count()
    sets = gpu_sets(gpus, available)
    chunksize = chunksize or max(1000, min(20_000, events // (4 * workers)))
    directory = tempfile.mkdtemp(prefix="coffea-sonic-e2e-")
    files = max(1, min(16, os.cpu_count() or 1, workers))
    rows: list[dict] = []
    saved = _silence_tau_warnings()
    try:
        started = time.perf_counter()
        fileset = write_sample_parallel(directory + "/sample", events, files)
        # one chunk per worker warms every worker's engines / channels (see e2e._run_once)
        warmup = write_sample_parallel(directory + "/warmup", chunksize * workers, files, seed=1)
        progress(f"e2e: wrote {events} events in {files} files per dataset in "
                 f"{time.perf_counter() - started:.0f} s; chunks of {chunksize}, {workers} workers")
        with GpuUtilisation(interval_ms=200) as sampler:
            progress(f"e2e: in-process CPU inference, {workers} workers")
            rows.append({"inference": "cpu", "gpus": 0,
                         **_run_once(InProcessJetTagging("cpu"), fileset, warmup, workers,
                                     chunksize, None, sampler)})
            progress(f"e2e: {_row_line(rows[-1])}")
            if local_gpu and available:
                progress(f"e2e: in-process GPU inference in every worker ({available} GPUs)")
                rows.append({"inference": "gpu-local", "gpus": available,
                             **_run_once(InProcessJetTagging("cuda"), fileset, warmup, workers,
                                         chunksize, None, sampler.only(range(available)))})
                progress(f"e2e: {_row_line(rows[-1])}")
            if available and not sets:
                progress(f"e2e: no served run: this machine has {available} GPU(s), none of the "
                         f"counts asked for ({', '.join(map(str, gpus))})")
            # without a GPU: one served run on a CPU server (what this machine can show)
            for gpu_list in sets if available else [[]]:
                rows.append(_served_run(LocalTritonServer, gpu_list, fileset, warmup, workers,
                                        chunksize, sampler, server_options or {}, progress))
                progress(f"e2e: {_row_line(rows[-1])}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        _restore_warnings(saved)
    return summarise(rows, events=events, workers=workers, chunksize=chunksize,
                     gpus_available=available)


def _served_run(server_class: Any, gpu_list: list[int], fileset: dict, warmup: dict, workers: int,
                chunksize: int, sampler: Any, server_options: dict,
                progress: Callable[[str], None]) -> dict:
    from ..examples.jet_tagging import JetTaggingProcessor
    from .probes import server_statistics, server_statistics_summary, statistics_transport

    where = f"{len(gpu_list)} GPU(s) {gpu_list}" if gpu_list else "a CPU server (no GPU here)"
    progress(f"e2e: served on {where}, {workers} workers")
    placement = dict(device="gpu", gpus=gpu_list) if gpu_list else dict(device="cpu")
    # every GPU gets its instances of every model, each a python-backend process loading torch:
    # on 4 GPUs that is about 70 processes starting at once
    options = {"startup_timeout_s": 300.0, **placement, **server_options}
    with server_class(models=E2E_MODELS, **options) as server:
        transport = statistics_transport(server.grpc_address)

        def measure_server() -> dict:
            return {name: server_statistics(transport, name) for name in E2E_MODELS}

        analysis = JetTaggingProcessor(f"triton+grpc://{server.grpc_address}", physics=True)
        row = _run_once(analysis, fileset, warmup, workers, chunksize, measure_server,
                        sampler.only(gpu_list) if gpu_list else None)
    label = f"served-{len(gpu_list)}gpu" if gpu_list else "served-cpu"
    return {"inference": label, "gpus": len(gpu_list), **row}


def summarise(rows: list[dict], **facts: Any) -> dict:
    """Speedups over the ``cpu`` row, the scaling model's inputs and predictions, a summary."""
    cpu = next((row for row in rows if row["inference"] == "cpu"), None)
    for row in rows:
        row["speedup"] = row["events_per_s"] / cpu["events_per_s"] if cpu else None
    served = [row for row in rows if row["inference"].startswith("served")]
    inputs = _scaling_inputs(cpu, served[0]) if served else None
    if inputs:
        for row in served:
            row["predicted_events_per_s"] = predicted_events_per_s(inputs, row["workers"],
                                                                   row["gpus"])
    result = {**facts, "models": list(E2E_MODELS), "rows": rows, "scaling_inputs": inputs}
    if inputs:
        model = ScalingModel(t_gpu=max(inputs["t_gpu"], 1e-12), t_latency=inputs["t_latency"],
                             p=inputs["p"], t_cpu=inputs["t_cpu"])
        result["advice"] = (f"one GPU saturates at about {model.saturation_clients():.0f} such "
                            f"workers: CPU:GPU ≈ {model.recommended_cpu_per_gpu()}:1")
    result["summary"] = " ".join(_row_line(row) for row in rows)
    return result


def _row_line(row: dict) -> str:
    gpu = f", GPU {row['gpu_percent']:.0f} %" if row.get("gpu_percent") is not None else ""
    speedup = f" ({row['speedup']:.2f}x cpu)" if row.get("speedup") else ""
    return (f"{row['inference']}: {row['events_per_s']:.0f} events/s{speedup}, inference share "
            f"{row['inference_share']:.2f}{gpu}, worker peak "
            f"{row['worker_peak_rss_bytes'] / 2**30:.2f} GiB.")


def markdown(result: dict, machine: str, command: str, date: str) -> str:
    """The end-to-end table of one run, for RESULTS.md."""
    lines = [f"**{machine}**, {date}: `{command}`", "",
             f"{result['events']} events, chunks of {result['chunksize']}, {result['workers']} "
             f"Dask workers, models {', '.join(result['models'])}.", "",
             "| inference | GPUs | events/s | vs in-process CPU | inference share | GPU busy "
             "| worker memory limit / peak | scaling model predicts |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        gpu = f"{row['gpu_percent']:.0f} %" if row.get("gpu_percent") is not None else "–"
        predicted = (f"{row['predicted_events_per_s']:.0f}" if row.get("predicted_events_per_s")
                     else "–")
        lines.append(
            f"| {row['inference']} | {row['gpus']} | {row['events_per_s']:.0f} | "
            f"{row['speedup']:.2f}× | {row['inference_share']:.2f} | {gpu} | "
            f"{row['worker_memory_bytes'] / 2**30:.1f} / {row['worker_peak_rss_bytes'] / 2**30:.2f}"
            f" GiB | {predicted} |")
    if result.get("scaling_inputs"):
        inputs = result["scaling_inputs"]
        lines += ["", f"Scaling model from the {inputs['from']}: p = {inputs['p']:.2f}, t_CPU = "
                      f"{1e3 * inputs['t_cpu']:.3f} ms/event, t_GPU = {1e6 * inputs['t_gpu']:.1f} "
                      f"µs/event, t_latency = {1e3 * inputs['t_latency']:.3f} ms/event; "
                      f"{result.get('advice', '')}."]
    return "\n".join(lines) + "\n"


def machine_words(info: dict) -> str:
    """The machine in words for a results table: GPUs (count x model), cores.

    >>> machine_words({"gpus": ["NVIDIA H200, 143771 MiB, 580"] * 2, "cpu_cores": 32})
    '2× NVIDIA H200, 32 cores'
    >>> machine_words({"gpus": [], "cpu_cores": 2})
    'no GPU, 2 cores'
    """
    gpus = info.get("gpus") or []
    card = f"{len(gpus)}× {gpus[0].split(',')[0].strip()}" if gpus else "no GPU"
    return f"{card}, {info.get('cpu_cores')} cores"


def write_results(result: dict, output: str, *, command: str) -> dict[str, str]:
    """results.json, results.md and e2e_machine.png (events/s per way of inference) in ``output``."""
    from pathlib import Path

    from .machine import machine_info

    folder = Path(output)
    info = machine_info()
    result = {**result, "machine": info, "command": command}
    write_report(result, folder, "results",
                 lambda report: markdown(report, machine_words(info), command, info["date"][:10]))
    written = {"json": folder / "results.json", "markdown": folder / "results.md"}
    plot = folder / "e2e_machine.png"
    if _plot(result, plot, machine_words(info)):
        written["plot"] = plot
    return {name: str(path) for name, path in written.items()}


def _plot(result: dict, path: Any, title: str) -> bool:
    try:
        plt = pyplot()
    except ImportError:
        return False
    rows = result["rows"]
    figure, axis = plt.subplots(figsize=(7, 4))
    names = [row["inference"] for row in rows]
    axis.bar(names, [row["events_per_s"] for row in rows], color="tab:blue", label="measured")
    predicted = [(name, row["predicted_events_per_s"]) for name, row in zip(names, rows)
                 if row.get("predicted_events_per_s")]
    if predicted:
        axis.scatter([name for name, _ in predicted], [value for _, value in predicted],
                     color="tab:red", marker="_", s=600, label="scaling model")
    axis.set_ylabel("events / s")
    axis.set_title(f"{result['events']} events, {result['workers']} workers; {title}", fontsize=9)
    axis.legend()
    save_figure(figure, path)
    return True
