"""TritonModel against coffea's ``triton_wrapper`` on a transport-bound model, all in one run.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import datetime as dt
import logging
import os
import statistics
import sys
import tempfile
import time
import timeit
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .machine import cpu_model, package_versions
from .modes import coffea_wrapper_class
from .passthrough import passthrough_inputs
from .probes import percentile
from .slice_model import write_slice_model

__all__ = ["Timings", "WrapperBench", "client_steps", "run_wrapper", "serial_breakdown",
           "summarize", "sweep"]

logger = logging.getLogger(__name__)

MiB = 1 << 20
MODEL = "slice16"
FEATURES, KEPT = 16, 2
#: Triton's per-model counters read around every call (``success``: receive to response)
STAT_KEYS = ("success", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass
class WrapperBench:
    """One run: the model configs (one server each), calls per client, the sweep."""

    max_batch_sizes: list[int] = field(default_factory=lambda: [65536, 262144])
    dynamic_batching: bool = True
    rows: int = 200_000
    rounds: int = 40
    #: calls per configuration of the sweep (0: no sweep); it runs on the largest max_batch_size
    sweep_rounds: int = 12
    sweep_mib: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0, 16.0])
    sweep_in_flight: list[int] = field(default_factory=lambda: [1, 2, 4, 8])


def _repository(dest: Path, max_batch_size: int, dynamic_batching: bool) -> Path:
    # Triton completes a dynamic batcher's preferred batch to max_batch_size: the wrapper's size
    return write_slice_model(dest, MODEL, ("x", [FEATURES]), ("y", [KEPT]), instances=1,
                             max_batch=max_batch_size,
                             queue_delay_us=100 if dynamic_batching else None)


@dataclass
class _Client:
    """One way of calling the model: ``call(inputs) -> outputs`` plus what it sends per call."""

    name: str
    call: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    describe: Callable[[], dict[str, Any]] = dict
    close: Callable[[], None] = lambda: None
    error: str | None = None


def _wrapper_client(address: str, rows: int) -> _Client:
    wrapper = coffea_wrapper_class()(f"triton+grpc://{address}/{MODEL}/1",
                                     client_args={"ssl": False})

    def describe() -> dict[str, Any]:
        batch = wrapper.batch_size
        requests = -(-rows // batch)
        return {"requests_per_call": requests, "rows_per_request": batch,
                "bytes_sent_per_call": requests * batch * FEATURES * 4, "in_flight": 1}

    def close() -> None:
        if getattr(wrapper, "_client", None) is not None:
            wrapper._client.close()

    return _Client("coffea-wrapper", lambda inputs: wrapper.numpy_call(["y"], inputs), describe,
                   close)


def _tritonmodel_client(name: str, url: str, **options: Any) -> _Client:
    """``TritonModel(url, **options)``; one that cannot work is a client with its error."""
    from ..model import TritonModel

    try:
        model = TritonModel(url, **options)
        model.info  # metadata and transport now: a failure here, not in a timed call
        model.transport_kind
    except Exception as error:  # noqa: BLE001 - recorded in the results as not measured
        return _Client(name, lambda inputs: {}, error=f"{type(error).__name__}: {error}")

    def describe() -> dict[str, Any]:
        stats = model.stats
        calls = max(stats.calls, 1)
        return {"requests_per_call": stats.requests / calls,
                "bytes_sent_per_call": stats.bytes_sent / calls,
                "rows_per_request": stats.rows / max(stats.requests, 1),
                "in_flight": model.max_in_flight, "max_request_bytes": model.max_request_bytes,
                "transport_kind": model.transport_kind,
                "retries": stats.retries, "failed_requests": stats.failed_requests}

    return _Client(name, model, describe, model.close)


def _server_counters(stats_client: Any) -> dict[str, float]:
    model = stats_client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    inference = model["inference_stats"]
    counters = {f"{key}_ns": float(inference[key].get("ns", 0)) for key in STAT_KEYS}
    counters["requests"] = float(inference["success"].get("count", 0))
    counters["executions"] = float(model.get("execution_count", 0))
    counters["rows"] = float(model.get("inference_count", 0))
    return counters


@dataclass
class Timings:
    """Seconds of every timed call of one client, and the server's work during them."""

    seconds: list[float] = field(default_factory=list)
    server: dict[str, float] = field(default_factory=dict)


def _round_robin(clients: list[_Client], inputs: dict[str, np.ndarray], rounds: int,
                 stats_client: Any | None) -> dict[str, Timings]:
    """``rounds`` calls of every client taking turns, the order rotated each round."""
    timings = {client.name: Timings() for client in clients}
    for index in range(rounds):
        shift = index % len(clients)
        for client in clients[shift:] + clients[:shift]:
            before = _server_counters(stats_client) if stats_client is not None else None
            began = time.perf_counter()
            client.call(inputs)
            timing = timings[client.name]
            timing.seconds.append(time.perf_counter() - began)
            if before is not None:
                for key, value in _server_counters(stats_client).items():
                    timing.server[key] = timing.server.get(key, 0.0) + value - before[key]
    return timings


def summarize(name: str, timing: Timings, wrapper: Timings | None, rows: int) -> dict[str, Any]:
    """Median rows/s, spread, Triton's side per call, and the ratio to the wrapper (of medians,
    and paired per round: the same round's calls saw about the same machine load)."""
    rates = [rows / seconds for seconds in timing.seconds]
    summary: dict[str, Any] = {
        "client": name, "calls": len(rates), "rows_per_s_median": statistics.median(rates),
        "rows_per_s_p25": percentile(rates, 25), "rows_per_s_p75": percentile(rates, 75),
        "ms_per_call_median": 1e3 * statistics.median(timing.seconds)}
    if wrapper is not None:
        reference = statistics.median(rows / s for s in wrapper.seconds)
        summary["ratio_to_wrapper"] = summary["rows_per_s_median"] / reference
        summary["ratio_to_wrapper_paired_median"] = statistics.median(
            w / s for s, w in zip(timing.seconds, wrapper.seconds))
    server, calls = timing.server, len(timing.seconds)
    if server and calls:
        executions = server.get("executions")
        summary["server"] = {
            "requests_per_call": server.get("requests", 0.0) / calls,
            "avg_batch_rows": server["rows"] / executions if executions else None,
            "request_ms_per_call": server["success_ns"] / 1e6 / calls,
            **{f"{key}_ms_per_call": server[f"{key}_ns"] / 1e6 / calls
               for key in STAT_KEYS if key != "success"}}
    return summary


def serial_breakdown(url: str, inputs: dict[str, np.ndarray], stats_client: Any,
                     calls: int) -> dict[str, Any]:
    """With one request in flight, wall time = client + wire + server exactly (no overlap)."""
    breakdown: dict[str, Any] = {}
    for transport in ("grpc", "shm"):
        client = _tritonmodel_client(transport, url, transport=transport, max_in_flight=1)
        if client.error:
            breakdown[transport] = client.error
            continue
        client.call(inputs)  # warm
        timing = _round_robin([client], inputs, calls, stats_client)[transport]
        per_call = {key: timing.server[f"{key}_ns"] / 1e6 / calls for key in STAT_KEYS}
        breakdown[transport] = {
            "wall_ms_per_call": 1e3 * statistics.median(timing.seconds),
            "requests_per_call": timing.server["requests"] / calls,
            **{f"server_{'request' if key == 'success' else key}_ms_per_call": value
               for key, value in per_call.items()},
            # the rest: encoding, gRPC on both ends, decode, assembly (mean, not median)
            "outside_server_ms_per_call":
                1e3 * statistics.fmean(timing.seconds) - per_call["success"],
            **client.describe()}
        client.close()
    return breakdown


def sweep(urls: dict[str, str], inputs: dict[str, np.ndarray],
          config: WrapperBench) -> list[dict[str, Any]]:
    """rows/s for every (transport, max_request_bytes, max_in_flight), taking turns per round;
    ``urls``: the model's URL per protocol (``grpc``, ``http``)."""
    clients, settings = [], {}
    for transport in ("grpc", "shm", "http"):
        for size in config.sweep_mib:
            for window in config.sweep_in_flight:
                name = f"{transport} {size:g} MiB x{window}"
                client = _tritonmodel_client(
                    name, urls["http" if transport == "http" else "grpc"], transport=transport,
                    max_request_bytes=int(size * MiB), max_in_flight=window)
                if client.error:
                    logger.warning("sweep: %s not measured: %s", name, client.error)
                    continue
                client.call(inputs)  # warm (shm regions sized, channel open)
                clients.append(client)
                settings[name] = (transport, size, window)
    timings = _round_robin(clients, inputs, config.sweep_rounds, None)
    records = []
    for client in clients:
        transport, size, window = settings[client.name]
        seconds = timings[client.name].seconds
        records.append({"transport": transport, "max_request_mib": size, "max_in_flight": window,
                        "rows_per_s_median": statistics.median(config.rows / s for s in seconds),
                        "ms_per_call_median": 1e3 * statistics.median(seconds),
                        **{k: v for k, v in client.describe().items()
                           if k in ("requests_per_call", "rows_per_request")}})
        client.close()
    return records


def _compare(clients: list[_Client], inputs: dict[str, np.ndarray], rounds: int,
             stats_client: Any) -> dict[str, Any]:
    """Check every client's answer, then time them round-robin; a client that cannot work is a
    row with its error."""
    usable = [client for client in clients if client.error is None]
    for client in usable:  # warm-up, and proof that every client gets the right answer
        got, expected = client.call(inputs)["y"], inputs["x"][:, :KEPT]
        if got.shape != expected.shape or not np.array_equal(got, expected):
            raise AssertionError(f"{client.name}: wrong outputs (shape {got.shape}, "
                                 f"expected {expected.shape})")
        client.call(inputs)
    timings = _round_robin(usable, inputs, rounds, stats_client)
    comparison = []
    for client in clients:
        if client.error:
            logger.warning("%s not measured: %s", client.name, client.error)
            comparison.append({"client": client.name, "error": client.error})
            continue
        wrapper = timings["coffea-wrapper"] if client.name != "coffea-wrapper" else None
        row = summarize(client.name, timings[client.name], wrapper, len(inputs["x"]))
        comparison.append({**row, "sent": client.describe()})
        client.close()
    return {"comparison": comparison,
            "timings_s": {name: timing.seconds for name, timing in timings.items()}}


def _measure_config(config: WrapperBench, max_batch_size: int, inputs: dict[str, np.ndarray],
                    workdir: Path, with_sweep: bool) -> dict[str, Any]:
    """Everything measured against one server config: comparison, serial breakdown, sweep."""
    import tritonclient.grpc as grpcclient

    from ..server import LocalTritonServer

    repository = _repository(workdir / f"models-{max_batch_size}", max_batch_size,
                             config.dynamic_batching)
    run: dict[str, Any] = {"config": {"max_batch_size": max_batch_size,
                                      "dynamic_batching": config.dynamic_batching,
                                      "rounds": config.rounds, "server_instances": 1}}
    with LocalTritonServer(repository=repository, device="cpu") as server:
        stats_client = grpcclient.InferenceServerClient(server.grpc_address)
        urls = {"grpc": server.url(MODEL),
                "http": f"triton+http://{server.http_address}/{MODEL}"}
        clients = [_wrapper_client(server.grpc_address, config.rows),
                   _tritonmodel_client("grpc", urls["grpc"], transport="grpc"),
                   _tritonmodel_client("shm", urls["grpc"], transport="shm"),
                   _tritonmodel_client("auto (default)", urls["grpc"]),
                   _tritonmodel_client("http", urls["http"], transport="http")]
        try:
            logger.info("max_batch_size %d: %d calls per client", max_batch_size, config.rounds)
            run.update(_compare(clients, inputs, config.rounds, stats_client))
            run["serial_breakdown"] = serial_breakdown(
                urls["grpc"], inputs, stats_client, max(5, config.rounds // 3))
            if with_sweep and config.sweep_rounds > 0:
                run["sweep"] = sweep(urls, inputs, config)
        finally:
            stats_client.close()
    return run


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run_wrapper(config: WrapperBench) -> dict[str, Any]:
    """Every server config of ``config`` and the client-side steps."""
    versions = package_versions(("coffea", "tritonclient", "numpy"))
    env = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "cpu_count": os.cpu_count(), "cpu_model": cpu_model(),
           "python": sys.version.split()[0], **{k: v or "?" for k, v in versions.items()},
           "command": " ".join(sys.argv), "load_before": _load()}
    inputs = passthrough_inputs(config.rows)
    workdir = Path(tempfile.mkdtemp(prefix="wrapper-vs-tritonmodel-"))
    largest = max(config.max_batch_sizes)
    results: dict[str, Any] = {
        "environment": env,
        "workload": {"rows": config.rows, "features": FEATURES, "outputs": KEPT, "model": MODEL},
        "client_steps": client_steps(inputs, 4 * MiB // (FEATURES * 4), repeats=15),
        "runs": [_measure_config(config, size, inputs, workdir, with_sweep=size == largest)
                 for size in config.max_batch_sizes]}
    env["load_after"] = _load()
    return results


def _wrapper_encode(x: np.ndarray) -> Any:
    """numpy_call's per-request work: resize (pads to the batch size; a copy), astype (a second
    copy even for float32), set_data_from_numpy (tobytes: a third), the protobuf request."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc._utils import _get_inference_request

    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(np.resize(x, x.shape).astype(np.float32))
    return _get_inference_request(
        model_name=MODEL, inputs=[tensor], model_version="1", request_id="",
        outputs=[grpcclient.InferRequestedOutput("y")], sequence_id=0, sequence_start=False,
        sequence_end=False, priority=0, timeout=None, parameters=None)


def client_steps(inputs: dict[str, np.ndarray], piece_rows: int, repeats: int) -> dict[str, Any]:
    """Milliseconds of each client-side step for one ``piece_rows``-row request in isolation
    (best of ``repeats``): TritonModel's gRPC encoding and decoding against the wrapper's.

    >>> steps = client_steps(passthrough_inputs(1000), piece_rows=1000, repeats=1)
    >>> steps["piece_bytes"], steps["request_wire_bytes"] > steps["piece_bytes"]
    (64000, True)
    """
    from tritonclient.grpc import service_pb2

    from ..transport.grpc.codec import decode_response, encode_framed, encode_request

    x = inputs["x"][:piece_rows]
    request = encode_request(MODEL, "1", {"x": x})
    wire = request.SerializeToString()
    response = service_pb2.ModelInferResponse(model_name=MODEL, model_version="1")
    response.outputs.add(name="y", datatype="FP32", shape=[len(x), KEPT])
    response.raw_output_contents.append(x[:, :KEPT].copy().tobytes())
    steps = {"memcpy_once_ms": x.copy, "tobytes_ms": x.tobytes,
             "tritonmodel_encode_framed_ms": lambda: encode_framed(MODEL, "1", {"x": x}),
             "protobuf_encode_request_ms": lambda: encode_request(MODEL, "1", {"x": x}),
             "protobuf_serialize_ms": request.SerializeToString,
             "server_like_parse_ms": lambda: service_pb2.ModelInferRequest.FromString(wire),
             "tritonmodel_decode_response_ms": lambda: decode_response(response),
             "wrapper_encode_request_ms": lambda: _wrapper_encode(x),
             "wrapper_serialize_ms": _wrapper_encode(x).SerializeToString}
    return {"piece_rows": len(x), "piece_bytes": int(x.nbytes), "request_wire_bytes": len(wire),
            **{name: 1e3 * min(timeit.repeat(step, number=1, repeat=repeats))
               for name, step in steps.items()}}
