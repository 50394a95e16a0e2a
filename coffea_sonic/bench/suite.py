"""Run every sweep of a :class:`~coffea_sonic.bench.config.BenchConfig` and collect one result dict.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Callable

import numpy as np

from .. import zoo
from ..errors import ConfigurationError, ModelNotFoundError, ServerUnavailableError
from .client import ClientJob, job_fields, max_abs_difference, run_clients
from .config import SERVED_MODES, BenchConfig
from .machine import machine_info
from .modes import output_row_bytes, row_bytes
from ..facility.check_report import parse_target
from ..server import LocalTritonServer, gpu_available
from ..transport.base import Transport
from ..transport.errors import TransportError
from .probes import GpuUtilisation, ServerMeter, percentile, statistics_transport
from .derived import compute_scaling, compute_targets, equality_summary, request_profile

logger = logging.getLogger(__name__)

SCHEMA = "coffea-sonic-bench/1"
Progress = Callable[[str], None]


def _summary(values: list[float]) -> dict:
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return {"median": None, "min": None, "max": None, "p25": None, "p75": None,
                "spread": None, "samples": []}
    median = float(np.median(array))
    return {
        "median": median, "min": float(array.min()), "max": float(array.max()),
        "p25": percentile(array, 25), "p75": percentile(array, 75),
        # (max - min) / median: how far apart the repetitions were
        "spread": float((array.max() - array.min()) / median) if median else None,
        "samples": [float(v) for v in array],
    }


def _latency_summary(latencies_s: list[float]) -> dict:
    array = np.asarray(latencies_s, dtype=float) * 1e3
    if array.size == 0:
        return {"count": 0}
    return {"count": int(array.size), "mean_ms": float(array.mean()),
            "p50_ms": percentile(array, 50), "p90_ms": percentile(array, 90),
            "p99_ms": percentile(array, 99), "max_ms": float(array.max())}


def _rss_summary(per_client: list[dict], tensor_bytes: int) -> dict:
    """Client memory per chunk: peak RSS inside the chunk minus RSS at its start, per process."""
    rss_growth = max(max(r["rss_growth_bytes"]) for r in per_client)
    # steady state: the median chunk of each process (a fresh process's first timed chunk can
    # still map one-time memory, e.g. an allocator arena for a new gRPC thread)
    steady_growth = max(float(np.median(r["rss_growth_bytes"])) for r in per_client)
    return {
        "peak_growth_bytes": int(rss_growth),
        "steady_growth_bytes": int(steady_growth),
        "per_client_max": [int(max(r["rss_growth_bytes"])) for r in per_client],
        "samples": [[int(v) for v in r["rss_growth_bytes"]] for r in per_client],
        "bound_bytes": 2 * tensor_bytes,
        "ratio_to_tensor_bytes": steady_growth / tensor_bytes,
        "worst_ratio_to_tensor_bytes": rss_growth / tensor_bytes,
        "within_bound": bool(steady_growth <= 2 * tensor_bytes),
    }


class BenchSuite:
    """State of one run: config, server address, reference outputs, measurements so far."""

    def __init__(self, config: BenchConfig, progress: Progress | None = None,
                 checkpoint: str | None = None) -> None:
        self.config = config
        self.checkpoint = checkpoint
        self.progress = progress or (lambda message: logger.info("%s", message))
        self.measurements: list[dict] = []
        self.skipped: list[dict] = []
        self.server_info: dict = {}
        self.server_address: str | None = None
        #: the gRPC transport server statistics and metadata are read through
        self.stats_transport: Transport | None = None
        self.model_versions: dict[str, str] = {}
        self.references: dict[str, dict[str, np.ndarray]] = {}
        #: local-gpu outputs: what outputs computed on the GPU are also compared with
        self.gpu_references: dict[str, dict[str, np.ndarray]] = {}
        self.gpu = gpu_available()
        self.machine = machine_info()
        self.modes: list[str] = []
        self.started = time.perf_counter()
        self._seen: dict[tuple, dict] = {}

    # -- set-up ------------------------------------------------------------------------------
    def available_modes(self) -> list[str]:
        modes = list(self.config.modes)
        if "local-gpu" in modes:
            reason = _local_gpu_unavailable()
            if reason:
                modes.remove("local-gpu")
                self.skipped.append({"mode": "local-gpu", "reason": reason})
        return modes

    def connect(self, stack: contextlib.ExitStack, modes: list[str]) -> list[str]:
        """Start or reach the server when a served mode is asked for; drop modes that can't run."""
        if not any(mode in SERVED_MODES for mode in modes) and not self.config.e2e_events:
            return modes
        config = self.config
        if config.server:
            try:
                self.server_address = parse_target(config.server).address
            except ConfigurationError as error:
                raise ConfigurationError(f"--server: {error}") from None
            self.server_info = {"address": self.server_address, "embedded": False}
        else:
            served_models = list(config.models)
            if config.e2e_events > 0:
                from .e2e import E2E_MODELS

                served_models += [name for name in E2E_MODELS if name not in served_models]
            self.progress(f"starting the embedded Triton server ({config.device}) for "
                          f"{', '.join(served_models)}")
            started = time.perf_counter()
            server = stack.enter_context(LocalTritonServer(
                models=served_models, device=config.device,
                instances=config.server_instances, startup_timeout_s=300))
            self.server_address = server.grpc_address
            instance_lines = [line.strip() for line in server.log_tail(400).splitlines()
                              if "ModelInstanceInitialize" in line or "GPU device" in line]
            self.server_info = {"instance_log": instance_lines[:20], "embedded": True,
                                "address": self.server_address, "device": server.device,
                                "instances": config.server_instances,
                                "startup_s": time.perf_counter() - started,
                                "log": str(server.log_path)}
        self.stats_transport = statistics_transport(self.server_address)
        try:
            live = self.stats_transport.ready(min(config.timeout_s, 30.0))
        except TransportError as error:
            raise ServerUnavailableError(
                f"no Triton server answers at {self.server_address}: {error.describe()}. Start one "
                "with `coffea-sonic serve` or leave out --server to use the embedded one") from None
        if not live:
            raise ServerUnavailableError(f"the Triton server at {self.server_address} is not ready")
        for model in config.models:
            try:
                metadata = self.stats_transport.model_info(model, "", config.timeout_s)
            except TransportError as error:
                self.skipped.append({"model": model, "modes": sorted(SERVED_MODES),
                                     "reason": f"not served at {self.server_address}: "
                                               f"{error.describe()}"})
                continue
            versions = sorted(metadata.versions, key=lambda v: int(v) if v.isdigit() else -1)
            self.model_versions[model] = versions[-1] if versions else "1"
        return modes

    def reference_outputs(self, model: str) -> dict[str, np.ndarray]:
        """In-process onnxruntime outputs on the benchmark chunk: what every mode must return."""
        if model not in self.references:
            from ..engines import CpuEngine

            inputs = zoo.example_inputs(model, self.config.chunk_rows_for(model), seed=0)
            self.references[model] = CpuEngine(model)(inputs)
        return self.references[model]

    # -- one measurement ---------------------------------------------------------------------
    def measure(self, model: str, mode: str, batch_size: int, in_flight: int, clients: int,
                sweep: str) -> dict | None:
        in_flight = in_flight if mode == "remote" else 1
        key = (model, mode, batch_size, in_flight, clients)
        if key in self._seen:
            record = self._seen[key]
            if sweep not in record["sweeps"]:
                record["sweeps"].append(sweep)
            return record
        served = mode in SERVED_MODES
        if served and model not in self.model_versions:
            return None
        config = self.config
        job = ClientJob(
            mode=mode, model=model, batch_size=batch_size, chunk_rows=config.chunk_rows_for(model),
            repetitions=config.repetitions, warmup=config.warmup, in_flight=in_flight,
            server_address=self.server_address if served else None,
            model_version=self.model_versions.get(model, "1"), timeout_s=config.timeout_s,
            cpu_threads=config.cpu_threads, keep_outputs=clients == 1)
        self.progress(f"{model:>16} {mode:<14} batch {batch_size:>6} in-flight {in_flight:>2} "
                      f"clients {clients:>2}")
        probe = ServerMeter(self.stats_transport if served else None, [model])
        gpu_sampler = GpuUtilisation() if self.gpu else None
        stack = contextlib.ExitStack()

        def on_start() -> None:
            probe.start()
            if gpu_sampler is not None:
                stack.enter_context(gpu_sampler)

        def on_stop() -> None:
            stack.close()
            probe.stop()

        try:
            with stack:
                per_client = run_clients(job, clients, on_start=on_start, on_stop=on_stop,
                                         timeout_s=max(600.0, config.timeout_s * 4))
        except Exception as error:  # noqa: BLE001 - one broken configuration must not end the run
            logger.exception("bench configuration %s failed", key)
            self.skipped.append({"model": model, "mode": mode, "batch_size": batch_size,
                                 "in_flight": in_flight, "clients": clients,
                                 "reason": f"{type(error).__name__}: {error}"})
            return None
        record = self._record(job, clients, per_client, probe, gpu_sampler)
        record["sweeps"] = [sweep]
        self._seen[key] = record
        self.measurements.append(record)
        self._write_checkpoint()
        return record

    def _write_checkpoint(self) -> None:
        """Keep what is measured so far on disk: a run killed at a time limit still reports."""
        if self.checkpoint:
            from .report import _clean

            Path(self.checkpoint).write_text(
                json.dumps(_clean({**self.snapshot(), "partial": True}), indent=1))

    def snapshot(self) -> dict:
        """The raw collected state (what :func:`finish_results` derives everything from)."""
        return {"schema": SCHEMA, "machine": self.machine, "config": self.config.to_dict(),
                "server": self.server_info, "modes_run": self.modes, "skipped": self.skipped,
                "measurements": self.measurements,
                "elapsed_s": time.perf_counter() - self.started}

    def _record(self, job: ClientJob, clients: int, per_client: list[dict],
                probe: ServerMeter, gpu_sampler: GpuUtilisation | None) -> dict:
        config = self.config
        rows = job.chunk_rows
        # repetition r of the aggregate = the sum over clients of their r-th chunk's rate
        rep_rates = np.sum([[rows / seconds for seconds in result["chunk_seconds"]]
                            for result in per_client], axis=0)
        window_s = (max(r["finished_wall"] for r in per_client)
                    - min(r["started_wall"] for r in per_client))
        tensor_bytes = rows * row_bytes(job.model)
        events_per_row = config.events_per_row(job.model)
        latencies = [value for r in per_client for value in r["latencies_s"]]
        counters: dict[str, float] = {}
        for result in per_client:
            for name, value in result["client_counters"].items():
                counters[name] = counters.get(name, 0) + value
        chunks = job.repetitions * clients
        wire_sent = counters.get("bytes_sent")
        # requests actually sent per chunk: TritonModel counts its own split; else one per call
        requests_per_chunk = (counters["requests"] / chunks if counters.get("requests")
                              else per_client[0]["requests_per_chunk"])
        record = {
            **job_fields(job),
            "clients": clients,
            "rows_per_event": 1.0 / events_per_row,
            "rows_per_s": _summary(list(rep_rates)),
            "events_per_s": _summary(list(rep_rates * events_per_row)),
            "window_rows_per_s": rows * chunks / window_s if window_s > 0 else None,
            "chunk_seconds": [r["chunk_seconds"] for r in per_client],
            "latency": _latency_summary(latencies),
            "requests_per_chunk": requests_per_chunk,
            "effective_batch": rows / requests_per_chunk if requests_per_chunk else None,
            "tensor_bytes_per_chunk": tensor_bytes,
            "output_bytes_per_chunk": rows * output_row_bytes(job.model),
            "payload_bytes_per_chunk": per_client[0]["payload_bytes_per_chunk"],
            "wire_bytes_sent_per_chunk": wire_sent / chunks if wire_sent else None,
            "wire_bytes_received_per_chunk": (counters["bytes_received"] / chunks
                                              if counters.get("bytes_received") else None),
            "client_counters": counters,
            "client_rss": _rss_summary(per_client, tensor_bytes),
            "server": probe.summary(job.model),
            "gpu": gpu_sampler.summary() if gpu_sampler is not None else None,
            "max_abs_diff": None,
        }
        if per_client[0]["outputs"] is not None:
            record["max_abs_diff"] = max_abs_difference(per_client[0]["outputs"],
                                                        self.reference_outputs(job.model))
        if job.mode == "local-gpu" and per_client[0]["outputs"] is not None:
            self.gpu_references.setdefault(job.model, per_client[0]["outputs"])
        gpu_reference = self.gpu_references.get(job.model)
        computed_on_gpu = job.mode == "local-gpu" or (
            job.mode in SERVED_MODES and self.server_info.get("device") == "gpu")
        if computed_on_gpu and gpu_reference is not None and per_client[0]["outputs"] is not None:
            record["max_abs_diff_vs_local_gpu"] = max_abs_difference(per_client[0]["outputs"],
                                                                     gpu_reference)
        record["profile"] = request_profile(record, counters)
        return record

    # -- sweeps ------------------------------------------------------------------------------
    def run_sweeps(self, modes: list[str]) -> None:
        config = self.config
        for model in config.models:
            reference_batch = config.reference_batch(model)
            for mode in modes:
                for batch_size in config.batch_sweep_for(model):
                    self.measure(model, mode, batch_size, config.default_in_flight, 1, "batch")
            if "remote" in modes:
                for in_flight in config.in_flight:
                    self.measure(model, "remote", reference_batch, in_flight, 1, "in_flight")
            for mode in config.client_modes:
                if mode not in modes:
                    continue
                for clients in config.clients:
                    self.measure(model, mode, reference_batch, config.default_in_flight, clients,
                                 "clients")


def _local_gpu_unavailable() -> str | None:
    """Why the local-gpu mode can't run here (None if it can)."""
    if not gpu_available():
        return "no CUDA GPU on this machine (nvidia-smi lists none)"
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install 'coffea-sonic[torch]')"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} cannot use the GPU (a CPU-only build?)"
    return None


def run_bench(config: BenchConfig, *, progress: Progress | None = None,
              checkpoint: str | None = None) -> dict:
    """Run every sweep of ``config``; return the JSON-ready result dict (docs/internals/bench.md).

    ``checkpoint``: a JSON file rewritten after every measurement with the records so far
    (:func:`finish_results` turns such a file into a full result).
    """
    suite = BenchSuite(config, progress, checkpoint)
    with contextlib.ExitStack() as stack:
        suite.modes = suite.connect(stack, suite.available_modes())
        for model in config.models:
            suite.reference_outputs(model)
        suite.run_sweeps(suite.modes)
        e2e = None
        if config.e2e_events > 0:
            from .e2e import run_end_to_end

            e2e = run_end_to_end(config.e2e_events, sorted(set(config.e2e_workers)),
                                 server_address=suite.server_address, progress=suite.progress)
    if not suite.measurements:
        raise ModelNotFoundError(
            f"no benchmark configuration ran; skipped: {suite.skipped}")
    return finish_results({**suite.snapshot(), "e2e": e2e})


def finish_results(raw: dict) -> dict:
    """Derived results (equality, targets, scaling fit) from raw measurements.

    ``raw`` is what :func:`run_bench` collected, or a checkpoint / earlier ``results.json`` read
    back (``coffea-sonic bench report FILE`` re-derives and re-plots without re-measuring).
    """
    config = BenchConfig(**{key: tuple(value) if isinstance(value, list) else value
                            for key, value in raw["config"].items()})
    measurements = raw["measurements"]
    for record in measurements:  # derived: recomputed, so older files get today's profile
        record["profile"] = request_profile(record, record.get("client_counters") or {})
    e2e = raw.get("e2e")
    scaling = compute_scaling(measurements, config)
    if e2e and e2e.get("scaling_inputs"):
        from .e2e import analysis_scaling

        scaling["analysis"] = analysis_scaling(e2e, config)
    modes_run = raw.get("modes_run") or sorted({r["mode"] for r in measurements},
                                               key=list(config.modes).index)
    return {
        "schema": SCHEMA,
        "machine": raw.get("machine") or machine_info(),
        "config": config.to_dict(),
        "server": raw.get("server") or {},
        "modes_run": modes_run,
        "skipped": raw.get("skipped", []),
        "measurements": measurements,
        "equality": equality_summary(measurements, (raw.get("server") or {}).get("device")),
        "targets": compute_targets(measurements),
        "scaling": scaling,
        "e2e": e2e,
        "elapsed_s": raw.get("elapsed_s", 0.0),
        "partial": bool(raw.get("partial", False)),
    }
