"""``coffea-sonic monitor``: a live terminal view of Triton servers' Prometheus metrics.

How each figure is computed: docs/internals/facility.md, "coffea-sonic monitor" (with an example).
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO

from prometheus_client.parser import text_string_to_metric_families

from ..cliargs import plain
from ..errors import ConfigurationError, SonicError
from ..stats import ServerStatistics
from .autoscaling import DEFAULT_THRESHOLD_MS, load_ms, verdict
from .check_report import parse_target

logger = logging.getLogger(__name__)

__all__ = ["GpuGauges", "ModelCounters", "ModelFigures", "Snapshot", "counters_from_statistics",
           "figures", "frame_record", "is_triton_url", "metrics_url", "monitor", "parse_metrics", "read_statistics",
           "render_frame", "scrape"]

# metric family -> ModelCounters field
_COUNTERS = {
    "nv_inference_count": "inferences",
    "nv_inference_exec_count": "executions",
    "nv_inference_request_success": "successes",
    "nv_inference_request_failure": "failures",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_input_duration_us": "compute_input_us",
    "nv_inference_compute_infer_duration_us": "compute_infer_us",
    "nv_inference_compute_output_duration_us": "compute_output_us",
    "nv_inference_request_duration_us": "request_us",
    "nv_inference_pending_request_count": "pending",
    "nv_cache_num_hits_per_model": "cache_hits",
    "nv_cache_num_misses_per_model": "cache_misses",
}
_GPU_GAUGES = {
    "nv_gpu_utilization": "utilization",
    "nv_gpu_memory_used_bytes": "memory_used",
    "nv_gpu_memory_total_bytes": "memory_total",
    "nv_gpu_power_usage": "power_w",
}


def is_triton_url(text: str) -> bool:
    """Whether ``text`` names Triton's gRPC/HTTP API (read: statistics), not a metrics endpoint.

    >>> is_triton_url("triton+grpc://gpu1:8001/jet_tagger"), is_triton_url("gpu1:8002")
    (True, False)
    """
    scheme, separator, _ = text.strip().partition("://")
    return bool(separator) and (scheme.lower().startswith("triton+")
                                or scheme.lower() in ("grpc", "grpcs"))


def metrics_url(text: str) -> str:
    """Normalise ``host:port`` or an URL without path to ``http://host:port/metrics``.

    >>> metrics_url("gpu1:8002"), metrics_url("http://gpu1:8002")
    ('http://gpu1:8002/metrics', 'http://gpu1:8002/metrics')
    """
    if is_triton_url(text):
        raise ConfigurationError(
            f"{text!r} is a Triton API URL, not a Prometheus metrics endpoint: give "
            "http://host:8002/metrics (Triton's --metrics-port, 8002 by default), or pass the "
            "Triton URL to monitor/scrape, which read its statistics API instead")
    url = text if "://" in text else f"http://{text}"
    scheme, _, rest = url.partition("://")
    if "/" not in rest:
        url += "/metrics"
    return url


@dataclass
class ModelCounters:
    """Cumulative counters (and the pending gauge) of one model version at one scrape."""

    model: str
    version: str
    inferences: float = 0.0
    executions: float = 0.0
    successes: float = 0.0
    failures: float = 0.0
    queue_us: float = 0.0
    compute_input_us: float = 0.0
    compute_infer_us: float = 0.0
    compute_output_us: float = 0.0
    request_us: float = 0.0
    pending: float = 0.0
    #: lookups in Triton's response cache that hit / missed (0 where the model has none)
    cache_hits: float = 0.0
    cache_misses: float = 0.0


@dataclass
class GpuGauges:
    """One GPU's gauges (utilisation 0..1, bytes, watts); NaN where not exported."""

    gpu: str
    utilization: float = math.nan
    memory_used: float = math.nan
    memory_total: float = math.nan
    power_w: float = math.nan


@dataclass
class Snapshot:
    """One scrape of one server: per (model, version) counters, GPUs, CPU, or the error."""

    url: str
    taken_at: float
    models: dict[tuple[str, str], ModelCounters] = field(default_factory=dict)
    gpus: list[GpuGauges] = field(default_factory=list)
    cpu_utilization: float = math.nan
    error: str = ""


def parse_metrics(text: str, url: str, taken_at: float) -> Snapshot:
    """Parse Triton's Prometheus text into a :class:`Snapshot` (failures summed over reasons)."""
    snapshot = Snapshot(url=url, taken_at=taken_at)
    gpus: dict[str, GpuGauges] = {}
    for family in text_string_to_metric_families(text):
        field_name = _COUNTERS.get(family.name)
        gpu_field = _GPU_GAUGES.get(family.name)
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            if field_name is not None:
                key = (sample.labels.get("model", "?"), sample.labels.get("version", ""))
                counters = snapshot.models.setdefault(key, ModelCounters(*key))
                setattr(counters, field_name, getattr(counters, field_name) + sample.value)
            elif gpu_field is not None:
                gpu = sample.labels.get("gpu_uuid") or sample.labels.get("gpu", "gpu")
                setattr(gpus.setdefault(gpu, GpuGauges(gpu)), gpu_field, sample.value)
            elif family.name == "nv_cpu_utilization":
                snapshot.cpu_utilization = sample.value
    snapshot.gpus = list(gpus.values())
    return snapshot


def scrape(url: str, timeout_s: float = 5.0) -> Snapshot:
    """Fetch and parse one server's metrics (or, for a Triton URL, read its statistics); a failure
    is recorded in ``Snapshot.error``."""
    if is_triton_url(url):
        return read_statistics(url, timeout_s)
    url = metrics_url(url)
    taken_at = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read().decode("utf-8", errors="replace")
    except http.client.HTTPException as error:  # e.g. a gRPC port answering in HTTP/2 frames
        host = urllib.parse.urlsplit(url).netloc
        return Snapshot(url=url, taken_at=taken_at, error=(
            f"{host} does not answer HTTP/1 ({type(error).__name__}): it looks like a Triton "
            f"gRPC port. Give its metrics URL, http://{host.rsplit(':', 1)[0]}:8002/metrics "
            f"(Triton's --metrics-port, 8002 by default), or the Triton URL "
            f"triton+grpc://{host} to read its statistics API"))
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return Snapshot(url=url, taken_at=taken_at,
                        error=f"cannot read {url}: {reason} (is this the server's --metrics-port?)")
    try:
        return parse_metrics(text, url, taken_at)
    except ValueError as error:
        return Snapshot(url=url, taken_at=taken_at,
                        error=f"{url} does not serve Prometheus metrics: {error}")


def counters_from_statistics(model: str, version: str, stats: ServerStatistics) -> ModelCounters:
    """Triton's statistics of one model version as the counters the metrics give (µs).

    >>> counters_from_statistics("m", "1", ServerStatistics(inference_count=8, queue_ns=3000)).queue_us
    3.0
    """
    return ModelCounters(
        model, version, inferences=float(stats.inference_count),
        executions=float(stats.execution_count), successes=float(stats.success_count),
        failures=float(stats.fail_count), queue_us=stats.queue_ns / 1e3,
        compute_input_us=stats.compute_input_ns / 1e3,
        compute_infer_us=stats.compute_infer_ns / 1e3,
        compute_output_us=stats.compute_output_ns / 1e3, request_us=math.nan, pending=math.nan,
        cache_hits=float(stats.cache_hit_count), cache_misses=float(stats.cache_miss_count))


def read_statistics(url: str, timeout_s: float = 5.0) -> Snapshot:
    """One :class:`Snapshot` from Triton's statistics API at ``url`` (``triton+grpc://host:port``
    for every model in its index, ``.../model[/version]`` for one), read through the transport the
    workers' settings give (:meth:`~coffea_sonic.transport.base.Transport.statistics`)."""
    from ..transport.errors import TransportError
    from ..transport.registry import open_transport

    target = parse_target(url)
    taken_at = time.monotonic()
    step = "repository index"
    try:
        transport = open_transport(target.settings(), target.protocol)
        if target.model:
            step = "model metadata"
            versions = ((target.version,) if target.version else
                        transport.model_info(target.model, "", timeout_s).versions)
            wanted = {target.model: versions}
        else:
            wanted = transport.model_index(timeout_s)
        step = "statistics"
        snapshot = Snapshot(url=target.label, taken_at=taken_at)
        for model, versions in wanted.items():
            for version in versions or ("",):
                snapshot.models[(model, version)] = counters_from_statistics(
                    model, version, transport.statistics(model, version, timeout_s))
        return snapshot
    except (TransportError, SonicError) as error:
        text = error.describe() if isinstance(error, TransportError) else str(error)
        advice = "is this the server's gRPC (or HTTP) port?"
        if getattr(error, "kind", "") == "restricted":
            advice = ("give its metrics endpoint (http://host:8002/metrics) instead, or the key "
                      "(settings protocol_key_name / protocol_key_env)"
                      + ("; or name the model: triton+grpc://host:port/MODEL"
                         if step == "repository index" else ""))
        return Snapshot(url=target.label, taken_at=taken_at,
                        error=f"cannot read the {step} of {target.label}: {text} ({advice})")


@dataclass(frozen=True)
class ModelFigures:
    """What the monitor shows for one model version over a window (or since server start).

    Times are µs; rates per second; None where the window has no requests/executions.
    """

    model: str
    version: str
    window_s: float | None
    inferences: float
    requests: float
    executions: float
    inferences_per_s: float | None
    requests_per_s: float | None
    average_batch: float | None
    queue_us_per_request: float | None
    compute_us_per_request: float | None
    queue_us_per_execution: float | None
    failures: float
    pending: float
    #: share of response-cache lookups that hit in the window (None: no lookups, no cache)
    cache_hit_rate: float | None = None


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def figures(previous: Snapshot | None, current: Snapshot) -> list[ModelFigures]:
    """Per-model figures from two scrapes (``previous`` None: cumulative since server start)."""
    window = (current.taken_at - previous.taken_at) if previous is not None else None
    results = []
    for key, now in sorted(current.models.items()):
        before = (previous.models.get(key) if previous is not None else None) or ModelCounters(*key)
        if any(getattr(now, name) < getattr(before, name) for name in ("inferences", "executions")):
            before = ModelCounters(*key)  # the server restarted: its counters began again
        inferences = now.inferences - before.inferences
        executions = now.executions - before.executions
        requests = now.successes - before.successes
        results.append(ModelFigures(
            model=now.model, version=now.version, window_s=window,
            inferences=inferences, requests=requests, executions=executions,
            inferences_per_s=inferences / window if window else None,
            requests_per_s=requests / window if window else None,
            average_batch=_ratio(inferences, executions),
            queue_us_per_request=_ratio(now.queue_us - before.queue_us, requests),
            compute_us_per_request=_ratio(now.compute_infer_us - before.compute_infer_us, requests),
            queue_us_per_execution=_ratio(now.queue_us - before.queue_us, executions),
            failures=now.failures - before.failures,
            pending=now.pending,
            cache_hit_rate=_ratio(now.cache_hits - before.cache_hits,
                                  (now.cache_hits - before.cache_hits)
                                  + (now.cache_misses - before.cache_misses)),
        ))
    return results


def _number(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.{digits}f}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.{digits}f}k"
    return f"{value:.{digits}f}"


_COLUMNS = ("MODEL", "VER", "INF/S", "REQ/S", "AVG BATCH", "QUEUE us/REQ", "COMPUTE us/REQ",
            "QUEUE us/EXEC", "FAILED", "PENDING", "CACHE HIT")


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i])
                      for i, cell in enumerate(row)) for row in rows]


def render_frame(pairs: Sequence[tuple[Snapshot | None, Snapshot]], *, color: bool = False,
                 threshold_ms: float = DEFAULT_THRESHOLD_MS) -> str:
    """One frame of the view for (previous, current) scrapes of each server, ending with the
    autoscaling load over all of them against ``threshold_ms`` (:mod:`.autoscaling`)."""
    bold, dim, red, reset = ("\033[1m", "\033[2m", "\033[31m", "\033[0m") if color else ("",) * 4
    lines = [f"{bold}coffea-sonic monitor{reset}  {time.strftime('%H:%M:%S')}"]
    for previous, current in pairs:
        lines.append("")
        if current.error:
            lines.append(f"{bold}{current.url}{reset}")
            lines.append(f"  {red}{current.error}{reset}")
            continue
        window = (f"last {current.taken_at - previous.taken_at:.1f} s" if previous is not None
                  else "since server start")
        extras = []
        if not math.isnan(current.cpu_utilization):
            extras.append(f"CPU {current.cpu_utilization * 100:.0f}%")
        for gpu in current.gpus:
            memory = (f" mem {gpu.memory_used / 2**30:.1f}/{gpu.memory_total / 2**30:.1f} GiB"
                      if not math.isnan(gpu.memory_total) else "")
            extras.append(f"GPU {gpu.gpu[:12]} {gpu.utilization * 100:.0f}%{memory}")
        lines.append(f"{bold}{current.url}{reset}  {dim}({window}){reset}  " + "  ".join(extras))
        rows = [list(_COLUMNS)]
        for figure in figures(previous, current):
            rows.append([figure.model, figure.version,
                         _number(figure.inferences_per_s), _number(figure.requests_per_s),
                         _number(figure.average_batch), _number(figure.queue_us_per_request),
                         _number(figure.compute_us_per_request),
                         _number(figure.queue_us_per_execution),
                         _number(figure.failures, 0), _number(figure.pending, 0),
                         "-" if figure.cache_hit_rate is None
                         else f"{100 * figure.cache_hit_rate:.0f}%"])
        if len(rows) == 1:
            lines.append("  (no models reported)")
        else:
            lines += ["  " + line for line in _table(rows)]
    lines.append("")
    load = load_ms(pairs)
    alarm = red if load is not None and load > threshold_ms else ""
    lines.append(f"{alarm}{verdict(load, threshold_ms, servers=len(pairs))}{reset if alarm else ''}")
    lines.append(f"{dim}QUEUE us/EXEC is that load per server and model, in us; Ctrl-C to quit"
                 f"{reset}")
    return "\n".join(lines)


def frame_record(pairs: Sequence[tuple[Snapshot | None, Snapshot]], *,
                 threshold_ms: float = DEFAULT_THRESHOLD_MS) -> dict:
    """One frame as plain data (``monitor --json``): per server its window, error, CPU, GPUs and
    :class:`ModelFigures`; the autoscaling load over all servers against ``threshold_ms``.

    >>> now = Snapshot("a", 1.0, {("m", "1"): ModelCounters("m", "1", inferences=8, executions=2)})
    >>> record = frame_record([(None, now)])
    >>> record["servers"][0]["models"][0]["average_batch"], record["load_ms"]
    (4.0, None)
    """
    servers = []
    for previous, current in pairs:
        servers.append({
            "url": current.url, "error": current.error or None,
            "window_s": current.taken_at - previous.taken_at if previous is not None else None,
            "cpu_utilization": current.cpu_utilization,
            "gpus": [vars(gpu) for gpu in current.gpus],
            "models": [vars(figure) for figure in figures(previous, current)]})
    load = load_ms(pairs)
    return {"time": time.time(), "servers": servers, "load_ms": load, "threshold_ms": threshold_ms,
            "scale_out": load is not None and load > threshold_ms}


def monitor(urls: Iterable[str], *, interval_s: float = 2.0, once: bool = False,
            frames: int | None = None, out: IO[str] | None = None, color: bool | None = None,
            threshold_ms: float = DEFAULT_THRESHOLD_MS, as_json: bool = False,
            cache_dirs: Sequence[str] = (), shadow_dirs: Sequence[str] = ()) -> int:
    """Scrape ``urls`` every ``interval_s`` and redraw the view; returns an exit code.

    ``urls``: metrics endpoints, or Triton URLs (their statistics API; docs/internals/facility.md).

    ``once``: scrape twice, ``interval_s`` apart, print one frame and return (1 if any server
    could not be read). ``frames`` stops after that many frames. On a terminal the screen is
    cleared between frames; otherwise frames are printed one after the other. ``as_json``: each
    frame is one line of JSON (:func:`frame_record`) instead. ``cache_dirs``: persistent
    inference caches whose hits, misses and bytes saved end each frame
    (:mod:`.cache_view`); ``shadow_dirs``: shadow validation's reports (:mod:`.shadow_view`).
    """
    targets = [parse_target(url).label if is_triton_url(url) else metrics_url(url) for url in urls]
    if not targets and not cache_dirs and not shadow_dirs:
        raise ConfigurationError("give at least one metrics URL, e.g. http://127.0.0.1:8002/metrics"
                                 ", or --inference-cache DIR")
    out = out or sys.stdout
    is_tty = hasattr(out, "isatty") and out.isatty() and not as_json
    color = is_tty if color is None else color
    previous: dict[str, Snapshot] = {}
    if once:
        previous = {url: scrape(url) for url in targets}
        time.sleep(interval_s)
        frames = 1
    shown = 0
    try:
        while True:
            current = {url: scrape(url) for url in targets}
            pairs = [(previous.get(url) if not previous.get(url, current[url]).error else None,
                      current[url]) for url in targets]
            frame = _with_caches(pairs, threshold_ms, as_json, color, cache_dirs, shadow_dirs)
            out.write(("\033[H\033[2J" if is_tty else "") + frame + "\n")
            out.flush()
            previous = current
            shown += 1
            if frames is not None and shown >= frames:
                break
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return 0
    return 1 if any(snapshot.error for snapshot in current.values()) else 0


def _with_caches(pairs: Sequence[tuple[Snapshot | None, Snapshot]], threshold_ms: float,
                 as_json: bool, color: bool, cache_dirs: Sequence[str],
                 shadow_dirs: Sequence[str] = ()) -> str:
    """One frame, text or JSON, with the inference caches' and shadow validation's figures at
    its end."""
    from .cache_view import cache_lines, cache_record
    from .shadow_view import shadow_lines, shadow_record

    if as_json:
        record = frame_record(pairs, threshold_ms=threshold_ms) if pairs else {"time": time.time()}
        if cache_dirs:
            record["inference_caches"] = [cache_record(root) for root in cache_dirs]
        if shadow_dirs:
            record["shadow"] = [shadow_record(root) for root in shadow_dirs]
        return json.dumps(plain(record))
    text = render_frame(pairs, color=color, threshold_ms=threshold_ms) if pairs else (
        f"coffea-sonic monitor  {time.strftime('%H:%M:%S')}")
    for root in cache_dirs:
        text += "\n\n" + "\n".join(cache_lines(root))
    for root in shadow_dirs:
        text += "\n\n" + "\n".join(shadow_lines(root))
    return text

