"""The clients of ``bench wrapper`` and their timing: coffea's wrapper and TritonModel, call by call.

A :class:`Client` is one way of calling the transport-bound ``slice16`` model (16 FP32 per row
in, the first 2 back): coffea's ``triton_wrapper`` (:func:`wrapper_client`, the class the suite's
``coffea-wrapper`` mode uses) or a :class:`~coffea_sonic.TritonModel` (:func:`tritonmodel_client`).
:func:`round_robin` times the clients taking turns call by call, order rotated each round, with
Triton's counters read around every call (:func:`server_counters`); :func:`summarize` turns one
client's calls into median rows/s, spread and the ratio to the wrapper (of medians, and paired
per round: the same round's calls saw about the same machine load).

>>> timing = Timings(seconds=[0.5, 0.25, 1.0])
>>> row = summarize("grpc", timing, Timings(seconds=[1.0, 1.0, 1.0]), rows=100)
>>> row["rows_per_s_median"], row["ratio_to_wrapper"], row["ratio_to_wrapper_paired_median"]
(200.0, 2.0, 2.0)
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .modes import coffea_wrapper_class
from .slice_model import write_slice_model

__all__ = ["FEATURES", "KEPT", "MODEL", "Client", "Timings", "check_outputs", "round_robin",
           "server_counters", "slice_inputs", "summarize", "tritonmodel_client", "wrapper_client",
           "write_repository"]

logger = logging.getLogger(__name__)

MODEL = "slice16"
FEATURES, KEPT = 16, 2
#: Triton's per-model counters read around every call (``success``: receive to response)
STAT_KEYS = ("success", "queue", "compute_input", "compute_infer", "compute_output")


def write_repository(dest: Path, max_batch_size: int, dynamic_batching: bool) -> Path:
    """Write the ``slice16`` model repository into ``dest``; returns ``dest``.

    Triton completes a dynamic batcher's preferred batch size to ``max_batch_size``, which
    coffea's wrapper then takes as its request size (shared/TRITON-NOTES.md).
    """
    return write_slice_model(dest, MODEL, ("x", [FEATURES]), ("y", [KEPT]), instances=1,
                             max_batch=max_batch_size,
                             queue_delay_us=100 if dynamic_batching else None)


def slice_inputs(rows: int) -> dict[str, np.ndarray]:
    """``{"x": rows x 16 float32}``, the same every run (the answer is ``x[:, :2]``).

    >>> slice_inputs(4)["x"].shape
    (4, 16)
    """
    return {"x": np.random.default_rng(0).standard_normal((rows, FEATURES)).astype(np.float32)}


@dataclass
class Client:
    """One way of calling the model: ``call(inputs) -> outputs`` plus what it sends per call."""

    name: str
    call: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    describe: Callable[[], dict[str, Any]] = lambda: {}
    close: Callable[[], None] = lambda: None
    error: str | None = None


def wrapper_client(address: str, rows: int) -> Client:
    """coffea's wrapper as a user writes it (TLS off: the embedded server speaks plain gRPC)."""
    wrapper = coffea_wrapper_class()(f"triton+grpc://{address}/{MODEL}/1",
                                     client_args={"ssl": False})

    def describe() -> dict[str, Any]:
        batch = wrapper.batch_size
        requests = -(-rows // batch)
        return {"requests_per_call": requests, "rows_per_request": batch,
                "bytes_sent_per_call": requests * batch * FEATURES * 4, "in_flight": 1}

    def close() -> None:
        client = getattr(wrapper, "_client", None)
        if client is not None:
            client.close()

    return Client("coffea-wrapper", lambda inputs: wrapper.numpy_call(["y"], inputs), describe,
                  close)


def tritonmodel_client(name: str, url: str, **options: Any) -> Client:
    """``TritonModel(url, **options)``; a transport that cannot work gives a Client with error."""
    from ..model import TritonModel

    try:
        model = TritonModel(url, **options)
        model.info  # metadata now: a missing server fails here, not in a timed call
        model.transport_kind  # and the transport (one that cannot work raises here)
    except Exception as error:  # noqa: BLE001 - recorded in the results as not measured
        return Client(name, lambda inputs: {}, error=f"{type(error).__name__}: {error}")

    def describe() -> dict[str, Any]:
        stats = model.stats
        calls = max(stats.calls, 1)
        return {"requests_per_call": stats.requests / calls,
                "bytes_sent_per_call": stats.bytes_sent / calls,
                "rows_per_request": stats.rows / max(stats.requests, 1),
                "in_flight": model.max_in_flight, "max_request_bytes": model.max_request_bytes,
                "transport_kind": model.transport_kind,
                "retries": stats.retries, "failed_requests": stats.failed_requests}

    return Client(name, model, describe, model.close)


def server_counters(stats_client: Any) -> dict[str, float]:
    """Triton's cumulative counters for the model (tritonclient's gRPC client, as JSON)."""
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

    def add_server(self, after: dict[str, float], before: dict[str, float]) -> None:
        for key, value in after.items():
            self.server[key] = self.server.get(key, 0.0) + value - before[key]


def check_outputs(client: Client, inputs: dict[str, np.ndarray]) -> None:
    """Every client must return exactly the slice the model computes (AssertionError if not)."""
    got = client.call(inputs)["y"]
    expected = inputs["x"][:, :KEPT]
    if got.shape != expected.shape or not np.array_equal(got, expected):
        raise AssertionError(f"{client.name}: wrong outputs (shape {got.shape}, "
                             f"expected {expected.shape})")


def round_robin(clients: list[Client], inputs: dict[str, np.ndarray], rounds: int,
                stats_client: Any | None) -> dict[str, Timings]:
    """Time ``rounds`` calls of every client, taking turns; server counters around each call."""
    timings = {client.name: Timings() for client in clients}
    for index in range(rounds):
        shift = index % len(clients)
        for client in clients[shift:] + clients[:shift]:  # rotate: nobody always goes first
            before = server_counters(stats_client) if stats_client is not None else None
            began = time.perf_counter()
            client.call(inputs)
            timings[client.name].seconds.append(time.perf_counter() - began)
            if before is not None:
                timings[client.name].add_server(server_counters(stats_client), before)
    return timings


def _server_summary(server: dict[str, float], calls: int) -> dict[str, Any]:
    """Triton's side per call: requests, batch, request time and its parts (ms)."""
    return {
        "requests_per_call": server.get("requests", 0.0) / calls,
        "avg_batch_rows": server["rows"] / server["executions"] if server.get("executions") else None,
        # request time inside Triton (receive to response), summed over a call's requests
        "request_ms_per_call": server["success_ns"] / 1e6 / calls,
        **{f"{key}_ms_per_call": server[f"{key}_ns"] / 1e6 / calls
           for key in STAT_KEYS if key != "success"}}


def summarize(name: str, timing: Timings, wrapper: Timings | None, rows: int) -> dict[str, Any]:
    """Median rows/s, spread, and the ratio to the wrapper (of medians, and per round)."""
    rates = [rows / seconds for seconds in timing.seconds]
    summary: dict[str, Any] = {
        "client": name, "calls": len(rates), "rows_per_s_median": statistics.median(rates),
        "rows_per_s_p25": float(np.percentile(rates, 25)),
        "rows_per_s_p75": float(np.percentile(rates, 75)),
        "ms_per_call_median": 1e3 * statistics.median(timing.seconds)}
    if wrapper is not None:
        reference = statistics.median(rows / s for s in wrapper.seconds)
        summary["ratio_to_wrapper"] = summary["rows_per_s_median"] / reference
        summary["ratio_to_wrapper_paired_median"] = statistics.median(
            w / s for s, w in zip(timing.seconds, wrapper.seconds))
    if timing.server and timing.seconds:
        summary["server"] = _server_summary(timing.server, len(timing.seconds))
    return summary
