"""What a bench run's measurements say: request profiles, output equality, targets, scaling fits.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

from .config import GPU_OUTPUT_TOLERANCE, OUTPUT_TOLERANCE, SERVED_MODES, BenchConfig
from .scaling import ScalingModel, fit_scaling_model

__all__ = ["compute_scaling", "compute_targets", "equality_summary", "request_profile", "select"]


def request_profile(record: dict, counters: dict) -> dict | None:
    """Where one request's time goes (ms, means over the timed requests) for a served mode.
    Design notes: docs/internals/bench.md.

    >>> record = {"mode": "remote", "latency": {"mean_ms": 10.0}, "requests_per_chunk": 2,
    ...           "wire_bytes_sent_per_chunk": 4e6, "payload_bytes_per_chunk": 4e6,
    ...           "server": {"queue_ms_per_request": 1.0, "compute_input_ms_per_request": 0.5,
    ...                      "compute_infer_ms_per_request": 2.0,
    ...                      "compute_output_ms_per_request": 0.5}}
    >>> profile = request_profile(record, {"latency_s": 0.016, "requests": 2})
    >>> profile["client_ms"], profile["wire_and_server_overhead_ms"], profile["request_mb"]
    (2.0, 4.0, 2.0)
    """
    server = record.get("server")
    if record["mode"] not in SERVED_MODES or not server:
        return None
    observed = record["latency"].get("mean_ms")
    requests = record["requests_per_chunk"] or 1
    chunks = len(record.get("chunk_seconds") or [[]]) * len((record.get("chunk_seconds")
                                                                or [[None]])[0])
    if observed and record["latency"].get("count") and chunks:
        # latencies are per call of the runner; a default-batching call may hold several requests
        calls_per_chunk = record["latency"]["count"] / chunks
        observed = observed * calls_per_chunk / requests
    server_ms = (server["queue_ms_per_request"] + server["compute_input_ms_per_request"]
                 + server["compute_infer_ms_per_request"] + server["compute_output_ms_per_request"])
    sent = record.get("wire_bytes_sent_per_chunk") or record["payload_bytes_per_chunk"]
    profile = {
        "observed_ms": observed,
        "queue_ms": server["queue_ms_per_request"],
        "compute_input_ms": server["compute_input_ms_per_request"],
        "compute_infer_ms": server["compute_infer_ms_per_request"],
        "compute_output_ms": server["compute_output_ms_per_request"],
        "server_ms": server_ms,
        "request_mb": sent / requests / 1e6,
        "observed_gb_per_s": (sent / requests / 1e9) / (observed / 1e3) if observed else None,
        "round_trip_ms": None, "client_ms": None, "wire_and_server_overhead_ms": None,
    }
    if counters.get("requests") and counters.get("latency_s") is not None:
        round_trip = 1e3 * counters["latency_s"] / counters["requests"]
        profile.update(round_trip_ms=round_trip,
                       client_ms=max(0.0, observed - round_trip) if observed else None,
                       wire_and_server_overhead_ms=max(0.0, round_trip - server_ms))
    else:
        # coffea's wrapper keeps no round-trip clock: client and wire are not separable
        profile["wire_and_server_overhead_ms"] = max(0.0, observed - server_ms) if observed else None
    return profile


# -- derived results -------------------------------------------------------------------------
def _median(record: dict | None) -> float:
    return record["rows_per_s"]["median"] if record else 0.0


def select(measurements: list[dict], **where) -> list[dict]:
    """Records whose fields equal every ``where`` item (``sweep=`` matches membership).

    >>> select([{"mode": "cpu", "sweeps": ["batch"]}, {"mode": "remote", "sweeps": []}],
    ...        mode="cpu", sweep="batch")
    [{'mode': 'cpu', 'sweeps': ['batch']}]
    """
    sweep = where.pop("sweep", None)
    return [record for record in measurements
            if all(record.get(key) == value for key, value in where.items())
            and (sweep is None or sweep in record.get("sweeps", ()))]


def _batch_label(record: dict) -> str:
    if record["batch_size"] == 0:
        effective = record.get("effective_batch")
        return f"default batch ({effective:.0f} rows)" if effective else "default batch"
    return f"batch {record['batch_size']}"


def _best(records: list[dict]) -> dict | None:
    return max(records, key=_median, default=None)


def equality_summary(measurements: list[dict], server_device: str | None = None) -> dict:
    """Per model and mode, the worst max |Δ| against in-process onnxruntime; all within tolerance?
    Design notes: docs/internals/bench.md.

    >>> equality_summary([{"model": "m", "mode": "remote", "max_abs_diff": 3e-5}], "gpu")["all_equal"]
    True
    >>> equality_summary([{"model": "m", "mode": "remote", "max_abs_diff": 3e-5}], "cpu")["all_equal"]
    False
    """
    per_model = _worst_per_mode(measurements, "max_abs_diff")
    tolerances = {mode: (GPU_OUTPUT_TOLERANCE if mode == "local-gpu"
                         or (mode in SERVED_MODES and server_device == "gpu") else OUTPUT_TOLERANCE)
                  for modes in per_model.values() for mode in modes}
    vs_local_gpu = _worst_per_mode(measurements, "max_abs_diff_vs_local_gpu")
    worst = max((value for modes in per_model.values() for value in modes.values()), default=0.0)
    all_equal = bool(per_model) and all(value <= tolerances[mode] for modes in per_model.values()
                                        for mode, value in modes.items())
    return {"reference": "in-process onnxruntime (CpuEngine) on the same inputs",
            "tolerance": OUTPUT_TOLERANCE, "gpu_tolerance": GPU_OUTPUT_TOLERANCE,
            "tolerance_per_mode": tolerances, "max_abs_diff": per_model, "worst": worst,
            "all_equal": all_equal, "max_abs_diff_vs_local_gpu": vs_local_gpu}


def _worst_per_mode(measurements: list[dict], key: str) -> dict[str, dict[str, float]]:
    """The largest ``key`` of the records, per model and mode (records without it left out)."""
    worst: dict[str, dict[str, float]] = {}
    for record in measurements:
        if record.get(key) is not None:
            modes = worst.setdefault(record["model"], {})
            modes[record["mode"]] = max(modes.get(record["mode"], 0.0), record[key])
    return worst


#: Served aggregate / in-process on the same GPU: model -> minimum ratio.
SERVED_VS_LOCAL_GPU_TARGETS: dict[str, float] = {"emtrk_cnn": 0.9, "jet_tagger": 0.5}
WRAPPER_RATIO_TARGET = 3.0
GPU_UTILISATION_TARGET = 80.0


def _target(name: str, model: str, target: float | None, measured: float | None,
            detail: str, *, lower_is_better: bool = False, **extra) -> dict:
    met = None
    if target is not None and measured is not None:
        met = bool(measured <= target) if lower_is_better else bool(measured >= target)
    shortfall = None
    if met is False:
        by = 100 * abs(measured / target - 1)
        shortfall = (f"{'over' if lower_is_better else 'missed'} by {by:.0f} % "
                     f"({measured:.2f} vs {target:g})")
    return {"name": name, "model": model, "target": target, "measured": measured, "met": met,
            "lower_is_better": lower_is_better, "shortfall": shortfall, "detail": detail, **extra}


def compute_targets(measurements: list[dict]) -> list[dict]:
    """The target ratios from this run's measurements (same server, model and data)."""
    targets: list[dict] = []
    for model in sorted({record["model"] for record in measurements}):
        targets += _wrapper_targets(measurements, model)
        targets += _served_targets(measurements, model)
        targets += _memory_targets(measurements, model)
    return targets


def _wrapper_targets(measurements: list[dict], model: str) -> list[dict]:
    """TritonModel against coffea's triton_wrapper: at their defaults, and each at its best."""
    targets = []
    ours = select(measurements, model=model, mode="remote", clients=1)
    wrapper = select(measurements, model=model, mode="coffea-wrapper", clients=1)
    ours_default = [r for r in ours if r["batch_size"] == 0]
    wrapper_default = [r for r in wrapper if r["batch_size"] == 0]
    if ours_default and wrapper_default:
        mine, theirs = ours_default[0], wrapper_default[0]
        targets.append(_target(
            "TritonModel / coffea triton_wrapper throughput, both at their defaults", model,
            WRAPPER_RATIO_TARGET, _median(mine) / _median(theirs),
            f"what a user gets switching tools: TritonModel splits by max_batch_size with "
            f"{mine['in_flight']} in flight ({mine['effective_batch']:.0f} rows/request); the "
            f"wrapper sends the server's preferred batch ({theirs['effective_batch']:.0f} "
            "rows/request) one at a time"))
    if ours and wrapper:
        best_ours, best_wrapper = _best(ours), _best(wrapper)
        per_batch = {}
        for record in wrapper:
            same = [r for r in ours if r["batch_size"] == record["batch_size"]]
            if same and record["batch_size"] > 0:
                per_batch[str(record["batch_size"])] = _median(_best(same)) / _median(record)
        targets.append(_target(
            "TritonModel / coffea triton_wrapper throughput, each at its best batch", model,
            WRAPPER_RATIO_TARGET, _median(best_ours) / _median(best_wrapper),
            f"remote {_batch_label(best_ours)} in-flight {best_ours['in_flight']} vs wrapper "
            f"{_batch_label(best_wrapper)}; same-batch ratios: "
            + ", ".join(f"{batch}: {ratio:.2f}" for batch, ratio in per_batch.items()),
            ratio_per_batch=per_batch,
            min_ratio_same_batch=min(per_batch.values()) if per_batch else None))
    return targets


def _served_targets(measurements: list[dict], model: str) -> list[dict]:
    """The best served aggregate against in-process on the GPU (or the CPU where no GPU)."""
    targets = []
    ours = select(measurements, model=model, mode="remote", clients=1)
    served = [r for r in select(measurements, model=model, mode="remote")
              if r["sweeps"] and "clients" in r["sweeps"]] or ours
    local_gpu = select(measurements, model=model, mode="local-gpu", clients=1)
    cpu = select(measurements, model=model, mode="cpu", clients=1)
    best_served = _best(served)
    if best_served and local_gpu:
        best_local = _best(local_gpu)
        targets.append(_target(
            "served aggregate / in-process GPU (same GPU)", model,
            SERVED_VS_LOCAL_GPU_TARGETS.get(model), _median(best_served) / _median(best_local),
            f"remote {best_served['clients']} clients {_batch_label(best_served)} vs "
            f"local-gpu {_batch_label(best_local)}"))
        gpu = best_served.get("gpu") or {}
        if gpu.get("mean_percent") is not None:
            targets.append(_target(
                "GPU utilisation while served (%)", model, GPU_UTILISATION_TARGET,
                gpu["mean_percent"], f"nvidia-smi mean over the {best_served['clients']}-client "
                f"run (max {gpu['max_percent']:.0f} %)"))
    elif best_served and cpu:
        best_cpu = _best(cpu)
        targets.append(_target(
            "served aggregate / in-process CPU (no GPU here)", model, None,
            _median(best_served) / _median(best_cpu),
            f"remote {best_served['clients']} clients {_batch_label(best_served)} vs "
            f"cpu {_batch_label(best_cpu)}; informational: server and clients share "
            "this machine's cores"))
    return targets


def _memory_targets(measurements: list[dict], model: str) -> list[dict]:
    """The client's peak memory growth per chunk against the tensor bytes it sent."""
    overheads = [r for r in measurements if r["model"] == model and r["mode"] in SERVED_MODES]
    if not overheads:
        return []
    worst = max(overheads, key=lambda r: r["client_rss"]["ratio_to_tensor_bytes"])
    return [_target(
        "client peak RSS growth per chunk / tensor bytes sent", model, 2.0,
        worst["client_rss"]["ratio_to_tensor_bytes"],
        f"worst served configuration (median chunk per process): {worst['mode']} "
        f"{_batch_label(worst)} clients {worst['clients']}, "
        f"{worst['tensor_bytes_per_chunk'] / 2**20:.1f} MiB of tensors per chunk; worst "
        f"single chunk {worst['client_rss'].get('worst_ratio_to_tensor_bytes', 0):.2f}x",
        lower_is_better=True)]


def compute_scaling(measurements: list[dict], config: BenchConfig) -> dict:
    """Fit the SONIC scaling model per model to the clients sweep; add the network bound."""
    fits = {}
    for model in config.models:
        points = sorted(select(measurements, model=model, mode="remote", sweep="clients"),
                        key=lambda r: r["clients"])
        if len(points) < 2:
            continue
        clients = [r["clients"] for r in points]
        events_per_s = [r["events_per_s"]["median"] for r in points]
        rows_per_event = points[0]["rows_per_event"]
        busy = [(r.get("server") or {}).get("busy_s_per_row") for r in points]
        busy = [b for b in busy if b]
        hint = busy[-1] * rows_per_event if busy else None
        fit = fit_scaling_model(clients, events_per_s, p=1.0, t_cpu=0.0, t_gpu_hint=hint)
        wire = points[0].get("wire_bytes_sent_per_chunk") or points[0]["tensor_bytes_per_chunk"]
        received = (points[0].get("wire_bytes_received_per_chunk")
                    or points[0]["output_bytes_per_chunk"])
        bytes_per_event = (wire + received) / points[0]["chunk_rows"] * rows_per_event
        model_fit: ScalingModel = fit.model
        network = {f"{gbps:g}": model_fit.network_bound_clients(gbps, bytes_per_event)
                   for gbps in config.link_gbps}
        fits[model] = {
            "mode": "remote", "batch_size": points[0]["batch_size"],
            "rows_per_event": rows_per_event, "bytes_per_event": bytes_per_event,
            "t_gpu_hint_from_server": hint, **fit.to_dict(),
            "t_gpu_per_row": model_fit.t_gpu / rows_per_event,
            "t_latency_per_row": model_fit.t_latency / rows_per_event,
            "network_bound_clients": network,
            "recommendation": _recommendation(model_fit, network),
        }
    return fits


def _recommendation(model: ScalingModel, network: dict[str, float]) -> str:
    from .report import format_seconds

    text = (f"one server saturates at {model.saturation_clients():.1f} pure-inference client "
            f"processes (t_ideal {format_seconds(model.t_ideal)} / t_GPU "
            f"{format_seconds(model.t_gpu)} per event): give it about "
            f"{model.recommended_cpu_per_gpu()} such clients; clients doing other work per event "
            "(p < 1) need proportionally more, see the analysis-level prediction")
    if network:
        link, clients = max(network.items(), key=lambda item: float(item[0]))
        text += (f"; at full speed a {link} Gb/s link carries {clients:.3g} of them, so the "
                 "network, not the server, bounds a remote deployment" if clients
                 < model.saturation_clients() else
                 f"; a {link} Gb/s link carries {clients:.3g} of them")
    return text
