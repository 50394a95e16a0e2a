"""Measure one configuration with one or several client processes.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from .. import zoo
from ..errors import InferenceError
from .clients import ClientPool, ready_then_start
from .modes import RunnerSpec, make_runner
from .probes import PeakRss

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ClientJob(RunnerSpec):
    """One client's part of a measurement: its runner, and the chunks it times (picklable:
    sent to spawned processes)."""

    chunk_rows: int
    repetitions: int
    warmup: int = 1
    seed: int = 0
    keep_outputs: bool = False


def _counter_delta(after: dict, before: dict) -> dict:
    return {key: after[key] - before.get(key, 0) for key in after
            if isinstance(after[key], (int, float))}


def run_client(job: ClientJob, on_ready: Callable[[], None] | None = None) -> dict:
    """Warm up, call ``on_ready`` (blocks until every client is ready), time the chunks.

    Returns per-chunk seconds, per-request latencies, peak RSS growth per chunk, wall-clock
    start/end (``time.time()``, comparable across processes), client counters, and with
    ``job.keep_outputs`` the outputs of the last chunk.
    """
    inputs = zoo.example_inputs(job.model, job.chunk_rows, seed=job.seed)
    runner = make_runner(job)
    try:
        for _ in range(job.warmup):
            runner.run(inputs)
        runner.latencies_s.clear()
        counters_before = runner.client_counters()
        if on_ready is not None:
            on_ready()
        chunk_seconds, rss_growth, outputs = [], [], None
        started_wall = time.time()
        for _ in range(job.repetitions):
            with PeakRss() as rss:
                started = time.perf_counter()
                outputs = runner.run(inputs)
                chunk_seconds.append(time.perf_counter() - started)
            rss_growth.append(rss.growth_bytes)
        finished_wall = time.time()
        rows = len(next(iter(outputs.values())))
        if rows != job.chunk_rows:
            raise InferenceError(
                f"mode {job.mode!r}, model {job.model!r}: got {rows} output rows for "
                f"{job.chunk_rows} input rows")
        return {
            "chunk_seconds": chunk_seconds,
            "latencies_s": list(runner.latencies_s),
            "rss_growth_bytes": rss_growth,
            "rows_per_chunk": job.chunk_rows,
            "requests_per_chunk": len(runner.latencies_s) // job.repetitions,
            "payload_bytes_per_chunk": runner.payload_bytes(job.chunk_rows),
            "client_counters": _counter_delta(runner.client_counters(), counters_before),
            "started_wall": started_wall,
            "finished_wall": finished_wall,
            "outputs": outputs if job.keep_outputs else None,
        }
    finally:
        runner.close()


def _job_task(task: dict, tasks: Any, control: Any, cache: dict) -> dict:
    """A :class:`~coffea_sonic.bench.clients.ClientPool` task: one client of ``task["job"]``,
    timing from the pool's common start."""
    return run_client(task["job"], on_ready=lambda: ready_then_start(tasks, control))


def run_clients(job: ClientJob, clients: int, *, on_start: Callable[[], None] | None = None,
                on_stop: Callable[[], None] | None = None, timeout_s: float = 600.0) -> list[dict]:
    """Run ``clients`` copies of ``job`` concurrently; one dict per client (see run_client).

    ``on_start`` runs once everyone is warmed up, just before they start timing; ``on_stop`` once
    they have all finished. One client runs in this process (no spawn cost); several run in a
    :class:`~coffea_sonic.bench.clients.ClientPool`.
    """
    if clients == 1:
        def ready() -> None:
            if on_start is not None:
                on_start()
        result = run_client(job, on_ready=ready)
        if on_stop is not None:
            on_stop()
        return [result]
    pool = ClientPool(clients, _job_task)
    try:
        _, collected = pool.run({"job": job, "duration": timeout_s}, clients,
                                on_start=lambda _: on_start() if on_start is not None else None)
    except RuntimeError as error:
        raise InferenceError(f"{clients} bench clients ({job.mode}, {job.model}): {error}") from None
    finally:
        pool.close()
    failed = [result["error"] for result in collected if "error" in result]
    if failed:
        raise InferenceError(f"a bench client ({job.mode}, {job.model}, batch {job.batch_size}) "
                             f"failed:\n{failed[0]}")
    if on_stop is not None:
        on_stop()
    return collected


def job_fields(job: ClientJob) -> dict:
    """The job as a plain dict (for the JSON record)."""
    return {key: value for key, value in asdict(job).items() if key != "keep_outputs"}


def max_abs_difference(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """Largest |a - b| over every output element (inf if names or shapes differ).

    >>> max_abs_difference({"y": np.array([1.0, 2.0])}, {"y": np.array([1.0, 2.5])})
    0.5
    """
    if set(outputs) != set(reference):
        return float("inf")
    worst = 0.0
    for name, expected in reference.items():
        actual = np.asarray(outputs[name])
        if actual.shape != expected.shape:
            return float("inf")
        if expected.size:
            worst = max(worst, float(np.max(np.abs(actual.astype(np.float64) - expected))))
    return worst
