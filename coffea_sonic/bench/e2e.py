"""End to end: the demo analysis with its inference in-process vs served.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
import warnings
from concurrent.futures import Future, ProcessPoolExecutor
from functools import partial
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .. import zoo
from ..errors import ConfigurationError
from ..examples.jet_tagging import PHYSICS_MODELS, JetTaggingProcessor
from ..stats import InferenceStats
from .config import BenchConfig
from .probes import ServerMeter
from .scaling import ScalingModel

logger = logging.getLogger(__name__)

#: Models the analysis calls (physics mode, on the synthetic sample, which has PF candidates).
E2E_MODELS: tuple[str, ...] = ("jet_tagger",) + PHYSICS_MODELS
_ENGINES: dict[tuple[str, str], Any] = {}
#: In-process engines run a chunk in pieces of at most this much input (TritonModel's gRPC size).
ENGINE_PIECE_BYTES = 4 * 2**20
Progress = Callable[[str], None]


def _worker_gpu() -> str:
    """The GPU of this Dask worker: local workers are named 0..W-1 and take the GPUs in turn."""
    import torch

    try:
        from distributed import get_worker

        index = int(get_worker().name)
    except (ImportError, ValueError, TypeError):
        index = os.getpid()
    return f"cuda:{index % max(torch.cuda.device_count(), 1)}"


def _engine(name: str, device: str = "cpu"):
    # One engine per model and worker process: the processor is unpickled for every chunk.
    if (name, device) not in _ENGINES:
        if device == "cpu":
            from ..engines import CpuEngine

            _ENGINES[name, device] = CpuEngine(name, threads=1)
        else:
            import torch

            from ..engines import GpuEngine

            torch.set_num_threads(1)  # one core per worker, as for onnxruntime
            _ENGINES[name, device] = GpuEngine(name, device=_worker_gpu())
    return _ENGINES[name, device]


class _EngineModel:
    """In-process stand-in for a TritonModel: same call surface, engine seconds in ``latency_s``."""

    def __init__(self, name: str, device: str = "cpu") -> None:
        self.name = name
        self.device = device
        self.info = zoo.spec(name)  # the outputs and output_names the processor reads
        self.stats = InferenceStats()
        self.call_hooks: tuple = ()  # nothing to trace, shadow or attribute in-process

    def infer_async(self, inputs: Mapping[str, np.ndarray]) -> Future:
        started = time.perf_counter()
        engine = _engine(self.name, self.device)
        rows = len(next(iter(inputs.values())))
        # Pieces of at most ENGINE_PIECE_BYTES of input, as a served call is split: the whole
        # chunk at once made particlenet's EdgeConv hold ~5 GiB per worker (4166-event chunks).
        row_bytes = max(sum(array[:1].nbytes for array in inputs.values()), 1)
        step = max(1, ENGINE_PIECE_BYTES // row_bytes)
        pieces = [engine({name: array[start:start + step] for name, array in inputs.items()})
                  for start in range(0, max(rows, 1), step)]
        outputs = pieces[0] if len(pieces) == 1 else {
            name: np.concatenate([piece[name] for piece in pieces]) for name in pieces[0]}
        elapsed = time.perf_counter() - started
        self.stats += InferenceStats(calls=1, requests=len(pieces), rows=rows, latency_s=elapsed,
                                     wait_s=elapsed)
        done: Future = Future()
        done.set_result(outputs)
        return done

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.infer_async(inputs).result()


class InProcessJetTagging(JetTaggingProcessor):
    """The analysis with every model run in-process: by onnxruntime (``device="cpu"``, the all-CPU
    baseline) or by torch on this worker's GPU (``device="cuda"``, a GPU in every worker).

    >>> sorted(InProcessJetTagging().sonic_models)
    ['deepmet', 'jet_tagger', 'particlenet']
    """

    def __init__(self, device: str = "cpu", **options: Any) -> None:
        options.setdefault("physics", True)
        super().__init__("triton+grpc://in-process:1", **options)
        self.device = device

    def sonic_model(self, name: str):
        clients = self.__dict__.setdefault("_sonic_clients", {})
        if name not in clients:
            clients[name] = _EngineModel(name, self.device)
            self.__dict__.setdefault("_sonic_baseline", {})[name] = clients[name].stats.copy()
        return clients[name]


def _write_part(args: tuple[str, int, int]) -> dict[str, list[str]]:
    from ..data.synthetic import write_sample

    directory, events, seed = args
    return write_sample(directory, events=events, files=1, seed=seed)


def write_sample_parallel(directory: str, events: int, files: int, seed: int = 0,
                          processes: int | None = None) -> dict[str, list[str]]:
    """Write ``events`` events of the synthetic sample (half per dataset) as ``files`` files per
    dataset, one process per file; returns ``{dataset: [paths]}``."""
    per_file = max(events // (2 * files), 1)
    parts = [(os.path.join(directory, f"part{index}"), per_file, seed * 100_003 + index)
             for index in range(files)]
    processes = max(1, min(processes or os.cpu_count() or 1, files))
    if processes == 1:
        written = [_write_part(part) for part in parts]
    else:
        with ProcessPoolExecutor(processes) as pool:
            written = list(pool.map(_write_part, parts))
    fileset: dict[str, list[str]] = {}
    for part in written:
        for dataset, paths in part.items():
            fileset.setdefault(dataset, []).extend(paths)
    return fileset


@contextlib.contextmanager
def _analysis_sample(events: int, files: int, warmup_events: int) -> Iterator[tuple[dict, dict]]:
    """``(fileset, warmup)`` written to a temporary folder, Dask's and NanoEvents' chatter quiet."""
    warnings.filterwarnings("ignore", message="Missing cross-reference index")
    import distributed  # noqa: F401 - its import sets its loggers to INFO; quiet them after

    for name in ("distributed", "dask_jobqueue"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # The synthetic sample has no Tau collection links: NanoEvents warns once per chunk in every
    # worker process (they read PYTHONWARNINGS at start).
    saved = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(
        filter(None, [saved, "ignore:Missing cross-reference index:RuntimeWarning"]))
    directory = tempfile.mkdtemp(prefix="coffea-sonic-e2e-")
    try:
        yield (write_sample_parallel(directory + "/sample", events, files),
               write_sample_parallel(directory + "/warmup", warmup_events, files, seed=1))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if saved is None:
            os.environ.pop("PYTHONWARNINGS", None)
        else:
            os.environ["PYTHONWARNINGS"] = saved


def _as_runner_fileset(fileset: Mapping[str, list[str]]) -> dict:
    return {name: {"files": {path: "Events" for path in files}} for name, files in fileset.items()}


def _worker_peak_rss() -> int:
    # runs in every Dask worker: its peak resident memory so far (VmHWM)
    from .probes import _rss_and_peak

    return _rss_and_peak()[1]


def histogram_bins(output: dict) -> dict[str, dict[str, list]]:
    """Every bin (flow bins too) of every histogram of an analysis output, per dataset: what two
    ways of running the same analysis must agree on (datasets are keyed by name, so the order in
    which Dask workers filled them does not matter).

    >>> import hist
    >>> h = hist.Hist(hist.axis.StrCategory([], growth=True, name="dataset"),
    ...               hist.axis.Regular(2, 0, 1, name="x"))
    >>> _ = h.fill(dataset="tt", x=[0.2, 0.7, 0.8])
    >>> histogram_bins({"histograms": {"score": h}})
    {'score': {'tt': [0.0, 1.0, 2.0, 0.0]}}
    """
    bins: dict[str, dict[str, list]] = {}
    for name, histogram in output.get("histograms", {}).items():
        datasets = list(histogram.axes["dataset"])
        bins[name] = {dataset: np.asarray(histogram[{"dataset": dataset}].values(flow=True))
                      .ravel().tolist() for dataset in datasets}
    return bins


def _run_once(analysis, fileset: dict[str, list[str]], warmup: dict[str, list[str]], workers: int,
              chunksize: int, server: str | None,
              gpu_mean: Callable[[float, float], float | None] | None = None) -> dict:
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    from ..facility.cluster import make_cluster

    # worker memory: this machine's, shared by the workers (make_cluster's default), so that a
    # big run neither pauses nor spills at the defaults
    with make_cluster("local", workers=workers, timeout_s=120) as cluster:
        worker_memory = min(cluster.worker_memory().values(), default=0)
        runner = processor.Runner(executor=processor.DaskExecutor(client=cluster.client, status=False),
                                  schema=NanoAODSchema, chunksize=chunksize, savemetrics=False)
        # Warm-up on other files: every worker loads its engine / opens its channel once, as in a
        # long job. (Same files would reuse the cached results: coffea submits pure tasks.)
        runner(_as_runner_fileset(warmup), treename="Events", processor_instance=analysis)
        meter = ServerMeter(server, E2E_MODELS)
        meter.start()
        started, started_at = time.perf_counter(), time.time()
        output = runner(_as_runner_fileset(fileset), treename="Events", processor_instance=analysis)
        wall_s = time.perf_counter() - started
        meter.stop()
        peaks = cluster.client.run(_worker_peak_rss)
        gpu_percent = gpu_mean(started_at, time.time()) if gpu_mean is not None else None
    events = sum(int(entry["events"]) for entry in output["cutflow"].values())
    jets = sum(int(entry["jets"]) for entry in output["cutflow"].values())
    inference: dict[str, InferenceStats] = output.get("inference", {})
    row = {
        "workers": workers, "worker_memory_bytes": worker_memory, "events": events, "jets": jets,
        "worker_peak_rss_bytes": max(peaks.values(), default=0), "gpu_percent": gpu_percent,
        "wall_s": wall_s,
        "events_per_s": events / wall_s,
        "inference_seconds": sum(stats.wait_s for stats in inference.values()),
        "inference_rows": {name: int(stats.rows) for name, stats in inference.items()},
        "bytes_sent": sum(int(stats.bytes_sent) for stats in inference.values()),
        "histograms": histogram_bins(output),
    }
    row["inference_share"] = row["inference_seconds"] / (wall_s * workers)
    if meter.models:
        row["server_busy_s"] = sum(meter.summary(name, wall_s)["busy_s"] for name in meter.models)
    return row


def run_end_to_end(events: int, workers: int | Sequence[int], *,
                   server_address: str | None = None, gpus: Sequence[int] = (1, 2, 4),
                   local_gpu: bool = False, chunksize: int | None = None,
                   server_options: dict | None = None, progress: Progress | None = None) -> dict:
    """Run the demo analysis in-process on CPU (and on every worker's GPU with ``local_gpu``) and
    served, with each worker count: served by the server at ``server_address``, or else by an
    embedded tritonserver on the first ``k`` GPUs for each ``k`` in ``gpus`` (on a CPU one where
    there is no GPU). The result keeps ``workers`` as given; docs/internals/bench.md."""
    from ..server.launcher import gpu_count
    from .probes import GpuUtilisation

    counts = sorted({workers} if isinstance(workers, int) else set(workers))
    if events < 1 or not counts or counts[0] < 1:
        raise ConfigurationError(f"need events >= 1 and workers >= 1, not {events} and {workers}")
    progress = progress or (lambda message: logger.info("%s", message))
    available = gpu_count()
    chunksize = chunksize or max(1000, min(20_000, events // (4 * counts[-1])))
    files = max(1, min(16, os.cpu_count() or 1, counts[-1]))
    rows: list[dict] = []
    started = time.perf_counter()
    # one chunk per worker warms every worker's engines / channels (see _run_once)
    with _analysis_sample(events, files, chunksize * counts[-1]) as (fileset, warmup), \
            GpuUtilisation(interval_ms=200) as sampler:
        progress(f"e2e: wrote {events} events in {files} files per dataset in "
                 f"{time.perf_counter() - started:.0f} s; chunks of {chunksize}")

        def run(label: str, n_workers: int, gpus_used: int | None, analysis: Any,
                server: str | None, gpu_mean: Callable[[float, float], float | None] | None):
            progress(f"e2e: {label}, {n_workers} worker(s)")
            row = _run_once(analysis, fileset, warmup, n_workers, chunksize, server, gpu_mean)
            rows.append({"inference": label, "gpus": gpus_used, **row})
            progress(f"e2e: {_row_line(rows[-1])}")

        # in-process and served runs alternate per worker count against one server
        for count in counts:
            run("cpu", count, 0, InProcessJetTagging("cpu"), None, sampler.mean_between)
            if local_gpu and available:
                run("gpu-local", count, available, InProcessJetTagging("cuda"), None,
                    partial(sampler.mean_between, gpus=range(available)))
            if server_address:
                run("served", count, None, _served_analysis(server_address), server_address,
                    None)
        if not server_address:
            _serve_on_gpus(run, counts, gpus, available, sampler, server_options, progress)
    return summarise(rows, events=events, workers=workers, chunksize=chunksize,
                     gpus_available=available)


def _served_analysis(address: str) -> JetTaggingProcessor:
    return JetTaggingProcessor(f"triton+grpc://{address}", physics=True)


def _serve_on_gpus(run: Callable[..., None], counts: Sequence[int], gpus: Sequence[int],
                   available: int, sampler: Any, server_options: dict | None,
                   progress: Progress) -> None:
    """The served runs of :func:`run_end_to_end` on embedded servers, one per GPU count."""
    from ..server import LocalTritonServer

    sets = gpu_sets(gpus, available)
    if available and not sets:
        progress(f"e2e: no served run: this machine has {available} GPU(s), none of the "
                 f"counts asked for ({', '.join(map(str, gpus))})")
    # without a GPU: one served run on a CPU server (what this machine can show)
    for gpu_list in sets if available else [[]]:
        progress(f"e2e: serving on {f'GPUs {gpu_list}' if gpu_list else 'a CPU server'}")
        placement = dict(device="gpu", gpus=gpu_list) if gpu_list else dict(device="cpu")
        # every GPU gets its instances of every model, each a python-backend process
        # loading torch: on 4 GPUs that is about 70 processes starting at once
        with LocalTritonServer(models=E2E_MODELS, startup_timeout_s=300.0, **placement,
                               **(server_options or {})) as server:
            for count in counts:
                run(f"served-{len(gpu_list)}gpu" if gpu_list else "served-cpu", count,
                    len(gpu_list), _served_analysis(server.grpc_address), server.grpc_address,
                    partial(sampler.mean_between, gpus=gpu_list) if gpu_list else None)


def _scaling_inputs(cpu: dict, served: dict) -> dict | None:
    """p, t_CPU, t_latency of the SONIC model from a cpu and a served row of as many workers;
    t_GPU from the GPUs' busy fraction when sampled, else from the server's busy seconds."""
    if served.get("gpu_percent") is not None:
        # GPU-seconds per event: the GPUs' busy fraction over the run, times their number
        t_gpu = (served["gpu_percent"] / 100.0 * served["wall_s"] * served["gpus"]
                 / served["events"])
    elif served.get("server_busy_s") is not None:
        t_gpu = max(served["server_busy_s"] / served["events"], 1e-12)
    else:
        return None
    p = min(max(cpu["inference_share"], 0.0), 1.0)
    t_cpu = cpu["wall_s"] * cpu["workers"] / cpu["events"]
    t_served = served["wall_s"] * served["workers"] / served["events"]
    return {"p": p, "t_cpu": t_cpu, "t_gpu": t_gpu, "t_served_one_worker": t_served,
            "t_latency": max(0.0, t_served - (1 - p) * t_cpu - t_gpu),
            "from": f"cpu and {served['inference']} runs"}


def analysis_scaling(e2e: dict, config: BenchConfig) -> dict:
    """The SONIC model of the demo analysis (measured p, t_CPU, t_GPU, t_latency) and its advice."""
    model = scaling_model(e2e["scaling_inputs"])
    served = [row for row in e2e["rows"] if row["inference"].startswith("served")]
    measured = {row["workers"]: row["events_per_s"] for row in served}
    top = max(max(measured, default=1) * 2, int(model.saturation_clients() * 1.5) + 1)
    predicted = [{"workers": n, "events_per_s": model.throughput(n)} for n in range(1, top + 1)]
    e2e["predicted"] = predicted
    bytes_per_event = (served[0]["bytes_sent"] / served[0]["events"]) if served else 0.0
    network = ({f"{gbps:g}": model.network_bound_clients(gbps, bytes_per_event)
                for gbps in config.link_gbps} if bytes_per_event else {})
    summary = (
        f"p = {model.p:.2f} of a worker's time is inference when it runs in-process "
        f"(t_CPU {1e3 * model.t_cpu:.3f} ms/event); the server needs t_GPU "
        f"{1e3 * model.t_gpu:.4f} ms/event and the client-side transport adds t_latency "
        f"{1e3 * model.t_latency:.3f} ms/event. One server saturates at "
        f"{model.saturation_clients():.0f} such workers: recommended CPU:GPU ≈ "
        f"{model.recommended_cpu_per_gpu()}:1; predicted speedup per worker below saturation "
        f"{model.speedup_over_cpu(1):.2f}× (Amdahl limit 1/(1−p) = "
        f"{1 / max(1 - model.p, 1e-9):.2f}×)")
    if network:
        summary += "; network bound (clients per link): " + ", ".join(
            f"{gbps} Gb/s: {count:.0f}" for gbps, count in network.items())
    return {"model": model.to_dict(), "bytes_per_event": bytes_per_event,
            "network_bound_clients": network, "measured_served_events_per_s": measured,
            "predicted": predicted, "summary": summary + "."}


def gpu_sets(counts: Sequence[int], available: int) -> list[list[int]]:
    """The GPU index lists of the served runs: the first ``k`` GPUs for each ``k`` that exists."""
    return [list(range(count)) for count in sorted(set(counts)) if 1 <= count <= available]


def scaling_model(inputs: dict, n_gpu: int = 1) -> ScalingModel:
    """The SONIC scaling model of measured ``inputs`` (p, t_cpu, t_gpu, t_latency) on ``n_gpu``."""
    return ScalingModel(t_gpu=max(inputs["t_gpu"], 1e-12), t_latency=inputs["t_latency"],
                        p=inputs["p"], t_cpu=inputs["t_cpu"], n_gpu=n_gpu)


def summarise(rows: list[dict], **facts: Any) -> dict:
    """Speedups over the ``cpu`` row of as many workers, the scaling model's inputs and
    predictions, a summary."""
    cpu = {row["workers"]: row for row in rows if row["inference"] == "cpu"}
    for row in rows:
        base = cpu.get(row["workers"])
        row["speedup"] = row["events_per_s"] / base["events_per_s"] if base else None
    served = [row for row in rows if row["inference"].startswith("served")]
    inputs = None
    if served and served[0]["workers"] in cpu:
        inputs = _scaling_inputs(cpu[served[0]["workers"]], served[0])
    if inputs:
        for row in served:
            row["predicted_events_per_s"] = scaling_model(inputs, row["gpus"] or 1).throughput(
                row["workers"])
    result = {**facts, "models": list(E2E_MODELS), "rows": rows, "scaling_inputs": inputs}
    if inputs:
        model = scaling_model(inputs)
        result["advice"] = (f"one GPU saturates at about {model.saturation_clients():.0f} such "
                            f"workers: CPU:GPU ≈ {model.recommended_cpu_per_gpu()}:1")
    result["summary"] = " ".join(
        [f"{facts['events']} events of the synthetic sample, chunks of {facts['chunksize']}, "
         f"models {', '.join(E2E_MODELS)}."] + [_row_line(row) for row in rows])
    return result


def _row_line(row: dict) -> str:
    gpu = f", GPU {row['gpu_percent']:.0f} %" if row.get("gpu_percent") is not None else ""
    speedup = f" ({row['speedup']:.2f}x cpu)" if row.get("speedup") else ""
    return (f"{row['inference']}, {row['workers']} worker(s): "
            f"{row['events_per_s']:.0f} events/s{speedup}, inference share "
            f"{row['inference_share']:.2f}{gpu}, worker peak "
            f"{row['worker_peak_rss_bytes'] / 2**30:.2f} GiB.")
