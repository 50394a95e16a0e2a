"""Probes a benchmark reads around its timed work: client memory, server statistics, GPU load.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
import time
from typing import Sequence

from ..errors import ConfigurationError
from ..stats import ServerStatistics
from ..transport.base import Transport

logger = logging.getLogger(__name__)

_STATUS_FIELD = re.compile(r"^(VmRSS|VmHWM):\s+(\d+)\s+kB", re.MULTILINE)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (NaN where there are none).

    >>> percentile([1.0, 2.0, 3.0, 4.0, 5.0], 75), percentile([], 50)
    (4.0, nan)
    """
    import numpy as np

    return float(np.percentile(values, q)) if len(values) else float("nan")


def _rss_and_peak() -> tuple[int, int]:
    with open("/proc/self/status") as status:
        fields = dict((name, int(kb) * 1024) for name, kb in _STATUS_FIELD.findall(status.read()))
    return fields["VmRSS"], fields["VmHWM"]


def current_rss_bytes() -> int:
    """This process's resident set size now, in bytes (Linux).

    >>> current_rss_bytes() > 0
    True
    """
    return _rss_and_peak()[0]


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


class PeakRss:
    """Context manager: ``growth_bytes`` = peak RSS inside the block minus RSS at its start.

    Allocations that the block frees again still count: that is the transient overhead a client
    needs per chunk (serialised requests, response buffers, copies).
    """

    sample_interval_s = 0.001

    def __init__(self) -> None:
        self.start_bytes = 0
        self.peak_bytes = 0
        self._sampler: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def growth_bytes(self) -> int:
        return max(0, self.peak_bytes - self.start_bytes)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, _rss_and_peak()[0])
            time.sleep(self.sample_interval_s)

    def __enter__(self) -> "PeakRss":
        self._exact = _reset_peak()
        self.start_bytes, _ = _rss_and_peak()
        self.peak_bytes = self.start_bytes
        if not self._exact:
            logger.debug("no /proc/self/clear_refs: sampling RSS every %.0f ms",
                         self.sample_interval_s * 1e3)
            self._stop.clear()
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()
        return self

    def __exit__(self, *exc_info) -> None:
        rss, peak = _rss_and_peak()
        if self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            self._sampler = None
        self.peak_bytes = max(self.peak_bytes, rss, peak if self._exact else 0)


def statistics_transport(server: str) -> Transport:
    """This process' gRPC transport to ``server`` (``host[:port]`` or ``triton+grpc://...``),
    with the settings a worker has for it (configured token and restricted-protocol key).

    >>> statistics_transport("triton+grpc://127.0.0.1:1/jet_tagger")
    GrpcTransport('127.0.0.1:1')
    """
    from ..facility.check_report import parse_target
    from ..transport.registry import open_transport

    target = parse_target(server)
    if target.protocol != "grpc":
        raise ConfigurationError(f"the benchmark reaches servers over gRPC; {server!r} is "
                                 f"{target.protocol}: give host:port or triton+grpc://host:port")
    return open_transport(target.settings(), "grpc")


class ServerMeter:
    """Triton's cumulative statistics of ``models`` (every version) at ``server`` (an address
    for :func:`statistics_transport`, or a transport; None: nothing to read), read at
    :meth:`start` and :meth:`stop`: what the server did for them over a timed window.

    >>> meter = ServerMeter("127.0.0.1:1", ["jet_tagger"])
    >>> meter.models, meter.summary("jet_tagger"), ServerMeter(None, ["jet_tagger"]).models
    (('jet_tagger',), None, ())
    """

    def __init__(self, server: "str | Transport | None", models: Sequence[str]) -> None:
        self.transport = statistics_transport(server) if isinstance(server, str) else server
        self.models = tuple(models) if server else ()
        self.before: dict[str, ServerStatistics] = {}
        self.after: dict[str, ServerStatistics] = {}
        self.started = self.stopped = 0.0

    def _read(self) -> dict[str, ServerStatistics]:
        return {model: self.transport.statistics(model, "", 30.0) for model in self.models}

    def start(self) -> None:
        self.before, self.started = self._read(), time.perf_counter()

    def stop(self, settle_s: float = 0.0) -> None:
        """The window's end; ``settle_s`` > 0: wait until two reads that far apart agree (where
        the requests the window sent are not known, the server has then counted them all)."""
        from ..stats import settled

        self.stopped = time.perf_counter()
        self.after = settled(self._read, settle_s, 30.0) if settle_s else self._read()

    def summary(self, model: str, wall_s: float | None = None) -> dict | None:
        """:func:`server_statistics_summary` of ``model`` over the window (``wall_s``: its
        seconds, default from :meth:`start` to :meth:`stop`); None before both ran."""
        if model not in self.before or model not in self.after:
            return None
        return server_statistics_summary(self.after[model] - self.before[model],
                                         self.stopped - self.started if wall_s is None else wall_s)


def server_statistics_summary(delta: ServerStatistics, wall_s: float) -> dict:
    """Per-request server times (ms) and how busy the model was over ``wall_s`` seconds.
    Design notes: docs/internals/bench.md.

    >>> delta = ServerStatistics(success_count=10, inference_count=1000, execution_count=5,
    ...                          queue_ns=20_000_000, compute_infer_ns=50_000_000)
    >>> summary = server_statistics_summary(delta, wall_s=0.1)
    >>> summary["queue_ms_per_request"], summary["compute_infer_ms_per_request"]
    (2.0, 5.0)
    >>> summary["busy_s"], summary["busy_fraction"]
    (0.025, 0.25)
    """
    requests = max(delta.success_count, 1)
    compute_s = delta.compute_input_s + delta.compute_infer_s + delta.compute_output_s
    busy_s = compute_s / requests * delta.execution_count
    summary = delta.to_dict()
    summary.update(
        wall_s=wall_s,
        queue_ms_per_request=1e3 * delta.queue_s / requests,
        compute_input_ms_per_request=1e3 * delta.compute_input_s / requests,
        compute_infer_ms_per_request=1e3 * delta.compute_infer_s / requests,
        compute_output_ms_per_request=1e3 * delta.compute_output_s / requests,
        busy_s=busy_s,
        busy_fraction=busy_s / wall_s if wall_s > 0 else 0.0,
        busy_s_per_row=busy_s / delta.inference_count if delta.inference_count else None,
    )
    return summary


def server_profile(summary: dict) -> dict:
    """Per-request server times (ms), average batch, requests, executions and busy fraction of
    one model from its :func:`server_statistics_summary` (the benchmark scripts' table columns).

    >>> delta = ServerStatistics(success_count=10, inference_count=1000, execution_count=5,
    ...                          queue_ns=20_000_000, compute_infer_ns=50_000_000)
    >>> profile = server_profile(server_statistics_summary(delta, wall_s=0.1))
    >>> profile["queue_ms"], profile["compute_infer_ms"], profile["avg_batch"], profile["busy_fraction"]
    (2.0, 5.0, 200.0, 0.25)
    """
    profile = {f"{part}_ms": round(summary[f"{part}_ms_per_request"], 3)
               for part in ("queue", "compute_input", "compute_infer", "compute_output")}
    profile.update(avg_batch=round(summary["average_batch"], 1),
                   requests=summary["success_count"], executions=summary["execution_count"],
                   busy_fraction=round(summary["busy_fraction"], 3))
    return profile


class GpuUtilisation:
    """Sample ``nvidia-smi`` every ``interval_ms`` while the block runs (no-op without a GPU).

    >>> with GpuUtilisation() as gpu:
    ...     pass
    >>> sorted(gpu.summary())
    ['available', 'max_percent', 'mean_percent', 'memory_used_max_mib', 'samples']
    >>> gpu.mean_between(0.0, time.time()) is None or gpu.available
    True
    """

    def __init__(self, interval_ms: int = 100) -> None:
        self.interval_ms = interval_ms
        self.utilisation: list[float] = []
        self.memory_used_mib: list[float] = []
        #: wall-clock time (``time.time()``) each sample was read
        self.times: list[float] = []
        #: the GPU (nvidia-smi index) each sample is of: nvidia-smi lists every GPU each time
        self.indices: list[int] = []
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self.available = shutil.which("nvidia-smi") is not None

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            parts = [part.strip() for part in line.split(",")]
            try:
                utilisation, memory, index = float(parts[0]), float(parts[1]), int(parts[2])
            except (ValueError, IndexError):
                continue
            self.utilisation.append(utilisation)
            self.memory_used_mib.append(memory)
            self.indices.append(index)
            self.times.append(time.time())

    def __enter__(self) -> "GpuUtilisation":
        if self.available:
            try:
                self._process = subprocess.Popen(
                    ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,index",
                     "--format=csv,noheader,nounits", f"-lms={self.interval_ms}"],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self.available = False
            else:
                self._reader = threading.Thread(target=self._read, daemon=True)
                self._reader.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            if self._reader is not None:
                self._reader.join(timeout=5)
            self._process = None

    def mean_between(self, start: float, end: float,
                     gpus: "Sequence[int] | None" = None) -> float | None:
        """Mean utilisation (%) of the samples read between ``start`` and ``end`` (``time.time()``)
        of the GPUs ``gpus`` (nvidia-smi indices; None: every GPU); None without samples there."""
        wanted = None if gpus is None else set(gpus)
        inside = [value for stamp, value, index in zip(self.times, self.utilisation, self.indices)
                  if start <= stamp <= end and (wanted is None or index in wanted)]
        return sum(inside) / len(inside) if inside else None

    def summary(self) -> dict:
        samples = self.utilisation
        return {
            "available": self.available,
            "samples": len(samples),
            "mean_percent": sum(samples) / len(samples) if samples else None,
            "max_percent": max(samples) if samples else None,
            "memory_used_max_mib": max(self.memory_used_mib) if self.memory_used_mib else None,
        }
