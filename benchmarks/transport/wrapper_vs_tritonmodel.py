"""TritonModel vs coffea's ``triton_wrapper`` on a transport-bound model, all in one run.

The model (``slice16``, Triton's python backend) returns the first 2 of 16 float32 inputs per row,
so a call's time is the transport's: client encoding, the wire or shared memory, Triton's copies
into and out of the python backend, and decoding. Every call sends 200 000 rows (12.8 MB in,
1.6 MB out) to an embedded :class:`~coffea_sonic.server.LocalTritonServer` on loopback.

Clients, each at its defaults (the only argument given is the transport):

==================  ==============================================================================
``coffea-wrapper``  ``coffea.ml_tools.triton_wrapper(...).numpy_call`` (``ssl=False``: the server
                    speaks plain gRPC); it pads every request to the batch size it resolves from the
                    server's config and sends one request at a time
``grpc``            ``TritonModel(url, transport="grpc")``
``shm``             ``TritonModel(url, transport="shm")``
``auto``            ``TritonModel(url)`` (what a user gets; shared memory on this host)
``http``            ``TritonModel(http_url, transport="http")`` (``triton+http://`` the HTTP port)
==================  ==============================================================================

The clients take turns call by call (round-robin, order rotated each round), so a change in the
machine's load hits all of them alike; each ratio is from this one run. Then, for the profile:

* Triton's statistics around every timed call: requests, queue and compute (input / infer /
  output) time per call on the server side;
* the client-side steps of one 4 MiB request (encoding copies of TritonModel and of the wrapper)
  timed in isolation;
* one request at a time (``max_in_flight=1``): call time split into server time and the rest;
* a sweep of ``max_request_bytes`` x ``max_in_flight`` for gRPC and shared memory;
* with ``--py-spy PATH``: a sampling profile of each client's calling thread (py-spy is not a
  project dependency: ``python -m venv /tmp/tools && /tmp/tools/bin/pip install py-spy``).

Two prototype rows (``prototype: framed gRPC``) are *not* TritonModel: hand-framed gRPC requests
(one copy per request, see ``bench_transport.FramedGrpc``), to show what the gRPC transport could
reach on the same wire.

Writes ``results.json``, ``results.md`` and ``wrapper_vs_tritonmodel.png`` under ``--out`` and
prints the table::

    .venv/bin/python benchmarks/transport/wrapper_vs_tritonmodel.py \\
        --out benchmarks/results/cpu2-transport --py-spy /tmp/tools/bin/py-spy
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from coffea_sonic.bench.report import format_rate
from coffea_sonic.bench.slice_model import write_slice_model

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

logger = logging.getLogger("wrapper_vs_tritonmodel")

MODEL = "slice16"
FEATURES, KEPT = 16, 2
ROWS = 200_000
MiB = 2**20

def write_repository(dest: Path, max_batch_size: int, dynamic_batching: bool) -> Path:
    """Write the ``slice16`` model repository into ``dest`` (``x``: 16 floats per row, answer
    ``y``: the first 2); return ``dest``."""
    # As in shared/TRITON-NOTES.md. Triton completes preferred_batch_size to max_batch_size, which
    # coffea's wrapper then takes as its request size (it reads max_batch_size without the block).
    return write_slice_model(dest, MODEL, ("x", [FEATURES]), ("y", [KEPT]), instances=1,
                             max_batch=max_batch_size,
                             queue_delay_us=100 if dynamic_batching else None)


# -- clients ----------------------------------------------------------------------------------------

@dataclass
class Client:
    """One way of calling the model: ``call(inputs) -> outputs`` plus what it sends per call."""

    name: str
    call: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    describe: Callable[[], dict[str, Any]] = lambda: {}
    close: Callable[[], None] = lambda: None
    error: str | None = None


def wrapper_client(address: str) -> Client:
    """coffea's wrapper as a user writes it (TLS off: the embedded server speaks plain gRPC)."""
    from coffea.ml_tools.triton_wrapper import triton_wrapper

    class SliceWrapper(triton_wrapper):
        """The subclass a user must write; only ``numpy_call`` (the array path) is timed."""

        def prepare_awkward(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark calls numpy_call directly")

    wrapper = SliceWrapper(f"triton+grpc://{address}/{MODEL}/1", client_args={"ssl": False})

    def describe() -> dict[str, Any]:
        batch = wrapper.batch_size
        requests = -(-ROWS // batch)
        return {"requests_per_call": requests, "rows_per_request": batch,
                "bytes_sent_per_call": requests * batch * FEATURES * 4, "in_flight": 1}

    return Client("coffea-wrapper", lambda inputs: wrapper.numpy_call(["y"], inputs), describe,
                  lambda: wrapper.client.close())


def tritonmodel_client(name: str, url: str, **options: Any) -> Client:
    """``TritonModel(url, **options)``; a transport this version lacks gives a Client with error."""
    from coffea_sonic import TritonModel

    try:
        model = TritonModel(url, **options)
        model.info  # resolve metadata now: a missing transport or server fails here, not timed
        model.transport_kind  # and the transport (a wrong one raises ConfigurationError here)
    except Exception as error:  # noqa: BLE001 - recorded: e.g. transport="http" not there yet
        return Client(name, lambda inputs: {}, error=f"{type(error).__name__}: {error}")

    def describe() -> dict[str, Any]:
        stats = model.stats
        calls = max(stats.calls, 1)
        return {"requests_per_call": stats.requests / calls,
                "bytes_sent_per_call": stats.bytes_sent / calls,
                "rows_per_request": stats.rows / max(stats.requests, 1),
                "in_flight": model.max_in_flight, "max_request_bytes": model.max_request_bytes,
                "transport": getattr(model, "transport", None),
                "transport_kind": getattr(model, "transport_kind", None),
                "retries": stats.retries, "failed_requests": stats.failed_requests}

    return Client(name, model, describe, model.close)


def framed_client(address: str, piece_bytes: int, window: int, channels: int) -> Client:
    """Prototype, not TritonModel: gRPC requests framed by hand (one copy per request, no protobuf
    serialization of the tensor bytes), ``window`` in flight, outputs written straight into the
    result array. It shows what the gRPC transport could reach with the same wire protocol.
    """
    from bench_transport import FramedGrpc  # the framing probe of bench_transport.py

    framed = FramedGrpc(address, channels=channels)
    piece_rows = max(1, piece_bytes // (FEATURES * 4))

    def call(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        out = np.empty((len(x), KEPT), np.float32)
        pending: list[tuple[int, Any]] = []

        def finish(start: int, future: Any) -> None:
            raw = future.result().raw_output_contents[0]
            out[start:start + len(raw) // (KEPT * 4)] = np.frombuffer(raw, np.float32).reshape(-1, KEPT)

        for start in range(0, len(x), piece_rows):
            if len(pending) >= window:
                finish(*pending.pop(0))
            pending.append((start, framed.submit(MODEL, {"x": x[start:start + piece_rows]})))
        for start, future in pending:
            finish(start, future)
        return {"y": out}

    def describe() -> dict[str, Any]:
        return {"requests_per_call": -(-ROWS // piece_rows), "rows_per_request": piece_rows,
                "bytes_sent_per_call": ROWS * FEATURES * 4, "in_flight": window,
                "channels": channels}

    return Client(f"prototype: framed gRPC {piece_bytes / MiB:g} MiB x{window}, {channels} ch",
                  call, describe)


# -- server statistics ------------------------------------------------------------------------------

STAT_KEYS = ("success", "queue", "compute_input", "compute_infer", "compute_output")


def server_counters(stats_client: Any) -> dict[str, float]:
    """Triton's cumulative counters for the model (tritonclient's gRPC client, as JSON)."""
    model = stats_client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    inference = model["inference_stats"]
    counters = {f"{key}_ns": float(inference[key].get("ns", 0)) for key in STAT_KEYS}
    counters["requests"] = float(inference["success"].get("count", 0))
    counters["executions"] = float(model.get("execution_count", 0))
    counters["rows"] = float(model.get("inference_count", 0))
    return counters


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in after}


# -- the timed comparison ---------------------------------------------------------------------------

@dataclass
class Timings:
    """Seconds of every timed call of one client, and the server's work during them."""

    seconds: list[float] = field(default_factory=list)
    server: dict[str, float] = field(default_factory=dict)

    def add_server(self, delta: dict[str, float]) -> None:
        for key, value in delta.items():
            self.server[key] = self.server.get(key, 0.0) + value


def check_outputs(client: Client, inputs: dict[str, np.ndarray]) -> None:
    """Every client must return exactly the slice the model computes."""
    got = client.call(inputs)["y"]
    expected = inputs["x"][:, :KEPT]
    if got.shape != expected.shape or not np.array_equal(got, expected):
        raise AssertionError(f"{client.name}: wrong outputs (shape {got.shape})")


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
                timings[client.name].add_server(_delta(server_counters(stats_client), before))
    return timings


def summarize(name: str, timing: Timings, wrapper: Timings | None) -> dict[str, Any]:
    """Median rows/s, spread, and the ratio to the wrapper (of medians, and per round)."""
    rates = [ROWS / seconds for seconds in timing.seconds]
    summary: dict[str, Any] = {
        "client": name, "calls": len(rates), "rows_per_s_median": statistics.median(rates),
        "rows_per_s_p25": float(np.percentile(rates, 25)),
        "rows_per_s_p75": float(np.percentile(rates, 75)),
        "ms_per_call_median": 1e3 * statistics.median(timing.seconds)}
    if wrapper is not None:
        reference = statistics.median(ROWS / s for s in wrapper.seconds)
        summary["ratio_to_wrapper"] = summary["rows_per_s_median"] / reference
        # paired: the same round's wrapper call saw about the same machine load
        summary["ratio_to_wrapper_paired_median"] = statistics.median(
            w / s for s, w in zip(timing.seconds, wrapper.seconds))
    server = timing.server
    calls = len(timing.seconds)
    if server and calls:
        requests = server.get("requests", 0.0)
        summary["server"] = {
            "requests_per_call": requests / calls,
            "avg_batch_rows": server["rows"] / server["executions"] if server.get("executions") else None,
            # request time inside Triton (receive to response), summed over a call's requests
            "request_ms_per_call": server["success_ns"] / 1e6 / calls,
            **{f"{key}_ms_per_call": server[f"{key}_ns"] / 1e6 / calls
               for key in STAT_KEYS if key != "success"}}
    return summary


# -- client-side steps of one request ---------------------------------------------------------------

def _best_of(function: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - began)
    return best


def client_steps(inputs: dict[str, np.ndarray], piece_rows: int, repeats: int) -> dict[str, Any]:
    """Milliseconds of each client-side step for one ``piece_rows``-row request, in isolation.

    TritonModel's gRPC path (:func:`coffea_sonic.transport.grpc.codec.encode_request`, what
    ``GrpcTransport.submit`` sends: ``tobytes`` then the protobuf field, then gRPC serializes the
    message) against the wrapper's (``numpy.resize`` + ``astype`` + ``set_data_from_numpy``'s
    ``tobytes``, tritonclient's request build, serialization). Internal functions that are
    missing (another version of the package) are reported as such.
    """
    x = inputs["x"][:piece_rows]
    steps: dict[str, Any] = {"piece_rows": piece_rows, "piece_bytes": int(x.nbytes)}
    steps["memcpy_once_ms"] = 1e3 * _best_of(lambda: x.copy(), repeats)
    steps["tobytes_ms"] = 1e3 * _best_of(lambda: x.tobytes(), repeats)
    try:
        from coffea_sonic.transport.grpc.codec import decode_response, encode_request
    except ImportError as error:
        steps["tritonmodel"] = f"not measured ({error})"
    else:
        request = encode_request(MODEL, "1", {"x": x})
        steps["tritonmodel_encode_request_ms"] = 1e3 * _best_of(
            lambda: encode_request(MODEL, "1", {"x": x}), repeats)
        steps["tritonmodel_serialize_ms"] = 1e3 * _best_of(request.SerializeToString, repeats)
        wire = request.SerializeToString()
        steps["request_wire_bytes"] = len(wire)
        from tritonclient.grpc import service_pb2

        steps["server_like_parse_ms"] = 1e3 * _best_of(
            lambda: service_pb2.ModelInferRequest.FromString(wire), repeats)
        response = service_pb2.ModelInferResponse(model_name=MODEL, model_version="1")
        response.outputs.add(name="y", datatype="FP32", shape=[piece_rows, KEPT])
        response.raw_output_contents.append(x[:, :KEPT].copy().tobytes())
        steps["tritonmodel_decode_response_ms"] = 1e3 * _best_of(
            lambda: decode_response(response), repeats)
    try:
        import tritonclient.grpc as grpcclient
        from tritonclient.grpc._utils import _get_inference_request
    except ImportError as error:
        steps["wrapper"] = f"not measured ({error})"
    else:
        def wrapper_encode() -> Any:
            # numpy_call's per-request work: resize (pads to the batch size; a copy), astype (a
            # second copy even for float32), set_data_from_numpy (tobytes: a third), then the
            # protobuf request (a fourth)
            tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(np.resize(x, x.shape).astype(np.float32))
            return _get_inference_request(
                model_name=MODEL, inputs=[tensor], model_version="1", request_id="",
                outputs=[grpcclient.InferRequestedOutput("y")], sequence_id=0,
                sequence_start=False, sequence_end=False, priority=0, timeout=None,
                parameters=None)

        steps["wrapper_encode_request_ms"] = 1e3 * _best_of(wrapper_encode, repeats)
        steps["wrapper_serialize_ms"] = 1e3 * _best_of(wrapper_encode().SerializeToString,
                                                       repeats)
    return steps


# -- one request at a time: where a call's time goes ------------------------------------------------

def serial_breakdown(url: str, inputs: dict[str, np.ndarray], stats_client: Any,
                     calls: int) -> dict[str, Any]:
    """With one request in flight, wall time = client + wire + server exactly (no overlap)."""
    breakdown: dict[str, Any] = {}
    for transport in ("grpc", "shm"):
        client = tritonmodel_client(transport, url, transport=transport, max_in_flight=1)
        if client.error:
            breakdown[transport] = client.error
            continue
        client.call(inputs)  # warm
        timing = round_robin([client], inputs, calls, stats_client)[transport]
        wall_ms = 1e3 * statistics.median(timing.seconds)
        server = timing.server
        per_call = {key: server[f"{key}_ns"] / 1e6 / calls for key in STAT_KEYS}
        requests = server["requests"] / calls
        breakdown[transport] = {
            "wall_ms_per_call": wall_ms, "requests_per_call": requests,
            "server_request_ms_per_call": per_call["success"],
            "server_compute_input_ms_per_call": per_call["compute_input"],
            "server_compute_infer_ms_per_call": per_call["compute_infer"],
            "server_compute_output_ms_per_call": per_call["compute_output"],
            "server_queue_ms_per_call": per_call["queue"],
            # the rest: encoding, gRPC on both ends, decode, assembly (mean, not median)
            "outside_server_ms_per_call": 1e3 * statistics.fmean(timing.seconds) - per_call["success"],
            **client.describe()}
        client.close()
    return breakdown


# -- the knobs ---------------------------------------------------------------------------------------

def sweep(urls: dict[str, str], inputs: dict[str, np.ndarray], transports: list[str],
          sizes_mib: list[float], in_flight: list[int], rounds: int) -> list[dict[str, Any]]:
    """rows/s for every (transport, max_request_bytes, max_in_flight), taking turns per round;
    ``urls``: the model's URL per protocol (``grpc``, ``http``)."""
    clients, settings = [], {}
    for transport in transports:
        url = urls["http" if transport == "http" else "grpc"]
        probe = tritonmodel_client(transport, url, transport=transport)
        if probe.error:
            logger.warning("sweep: transport %s unavailable: %s", transport, probe.error)
            continue
        probe.close()
        for size in sizes_mib:
            for window in in_flight:
                name = f"{transport} {size:g} MiB x{window}"
                client = tritonmodel_client(name, url, transport=transport,
                                            max_request_bytes=int(size * MiB), max_in_flight=window)
                if client.error:
                    logger.warning("sweep: %s unavailable: %s", name, client.error)
                    continue
                client.call(inputs)  # warm (shm regions sized, channel open)
                clients.append(client)
                settings[name] = (transport, size, window)
    timings = round_robin(clients, inputs, rounds, None)
    records = []
    for client in clients:
        transport, size, window = settings[client.name]
        seconds = timings[client.name].seconds
        records.append({"transport": transport, "max_request_mib": size, "max_in_flight": window,
                        "rows_per_s_median": statistics.median(ROWS / s for s in seconds),
                        "ms_per_call_median": 1e3 * statistics.median(seconds),
                        **{k: v for k, v in client.describe().items()
                           if k in ("requests_per_call", "rows_per_request")}})
        client.close()
    return records


# -- sampling profile (py-spy) ---------------------------------------------------------------------

def loop_for_profile(client_name: str, max_batch_size: int, seconds: float, ready: Path) -> None:
    """Child-process body of ``--py-spy``: call one client in a loop for ``seconds``."""
    from coffea_sonic.server import LocalTritonServer

    workdir = Path(tempfile.mkdtemp(prefix="wrapper-vs-tritonmodel-profile-"))
    repository = write_repository(workdir / "models", max_batch_size, True)
    inputs = {"x": np.random.default_rng(0).standard_normal((ROWS, FEATURES)).astype(np.float32)}
    with LocalTritonServer(repository=repository, device="cpu") as server:
        client = (wrapper_client(server.grpc_address) if client_name == "coffea-wrapper" else
                  tritonmodel_client(client_name, server.url(MODEL), transport=client_name))
        for _ in range(3):
            client.call(inputs)
        ready.write_text("ready")
        began, calls = time.monotonic(), 0
        while time.monotonic() - began < seconds:
            client.call(inputs)
            calls += 1
        ready.write_text(json.dumps({"ms_per_call": 1e3 * (time.monotonic() - began) / calls}))


def _main_thread_profile(raw: Path, top: int) -> dict[str, Any]:
    """Share of the calling thread's samples per function (self and inclusive) from py-spy."""
    self_counts: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if "MainThread" not in frames[0]:
            continue  # the caller's thread: where a call's wall time goes
        total += int(count)
        names = [re.sub(r" \(/.*?(site-packages|work/main)/", " (", frame) for frame in frames[1:]]
        if names:
            self_counts[names[-1]] += int(count)
        for name in set(names):
            inclusive[name] += int(count)
    share = lambda counter: [(name, round(count / max(total, 1), 3))  # noqa: E731
                             for name, count in counter.most_common(top)]
    return {"samples": total, "self": share(self_counts), "inclusive": share(inclusive)}


def sampling_profiles(py_spy: str, max_batch_size: int, seconds: float) -> dict[str, Any]:
    """py-spy (all threads, idle included) on a child process looping each client."""
    profiles: dict[str, Any] = {}
    for client_name in ("coffea-wrapper", "grpc", "shm"):
        with tempfile.TemporaryDirectory() as scratch:
            ready, raw = Path(scratch) / "ready", Path(scratch) / "profile.raw"
            child = subprocess.Popen([sys.executable, __file__, "--profile-child", client_name,
                                      "--max-batch-size", str(max_batch_size),
                                      "--profile-seconds", str(seconds + 10), "--ready", str(ready)])
            try:
                deadline = time.monotonic() + 120
                while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)  # the child starts its own server first
                subprocess.run([py_spy, "record", "-p", str(child.pid), "-d", str(int(seconds)),
                                "-r", "250", "--threads", "--idle", "--nonblocking",
                                "--format", "raw", "-o", str(raw)],
                               check=True, capture_output=True, timeout=seconds + 60)
                child.wait(timeout=seconds + 60)
                profiles[client_name] = {**json.loads(ready.read_text()),
                                         **_main_thread_profile(raw, top=20)}
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
    return profiles


# -- report ------------------------------------------------------------------------------------------

def _comparison_table(run: dict[str, Any]) -> list[str]:
    lines = ["| client | rows/s (median) | p25–p75 | ms/call | vs wrapper (medians) | vs wrapper "
             "(paired per round) | requests/call | server ms/call: request (input / infer / "
             "output) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in run["comparison"]:
        if "error" in row:
            lines.append(f"| {row['client']} | – | – | – | – | – | – | not measured: "
                         f"{row['error']} |")
            continue
        server = row.get("server", {})
        server_cell = (f"{server['request_ms_per_call']:.1f} "
                       f"({server['compute_input_ms_per_call']:.1f} / "
                       f"{server['compute_infer_ms_per_call']:.1f} / "
                       f"{server['compute_output_ms_per_call']:.1f})") if server else "–"
        ratio = row.get("ratio_to_wrapper")
        paired = row.get("ratio_to_wrapper_paired_median")
        requests = row.get("sent", {}).get("requests_per_call")
        lines.append(
            f"| {row['client']} | {format_rate(row['rows_per_s_median'])} | "
            f"{format_rate(row['rows_per_s_p25'])}–{format_rate(row['rows_per_s_p75'])} | "
            f"{row['ms_per_call_median']:.1f} | {f'**{ratio:.2f}x**' if ratio else '–'} | "
            f"{f'{paired:.2f}x' if paired else '–'} | "
            f"{f'{requests:g}' if requests is not None else '–'} | {server_cell} |")
    return lines


def _serial_table(serial: dict[str, Any]) -> list[str]:
    lines = ["| transport | wall | inside Triton (request) | of which input / infer / output | "
             "outside Triton (client + gRPC) | requests |", "|---|---|---|---|---|---|"]
    for transport, row in serial.items():
        if isinstance(row, str):
            lines.append(f"| {transport} | {row} | | | | |")
            continue
        lines.append(
            f"| {transport} | {row['wall_ms_per_call']:.1f} | "
            f"{row['server_request_ms_per_call']:.1f} | "
            f"{row['server_compute_input_ms_per_call']:.1f} / "
            f"{row['server_compute_infer_ms_per_call']:.1f} / "
            f"{row['server_compute_output_ms_per_call']:.1f} | "
            f"{row['outside_server_ms_per_call']:.1f} | {row['requests_per_call']:.0f} |")
    return lines


def _sweep_tables(records: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for transport in sorted({r["transport"] for r in records}):
        mine = [r for r in records if r["transport"] == transport]
        windows = sorted({r["max_in_flight"] for r in mine})
        sizes = sorted({r["max_request_mib"] for r in mine})
        lines += [f"**{transport}** (rows/s, median)", "",
                  "| max_request_bytes \\ max_in_flight | " + " | ".join(map(str, windows)) + " |",
                  "|---|" + "---|" * len(windows)]
        for size in sizes:
            cells = []
            for window in windows:
                match = [r for r in mine
                         if r["max_request_mib"] == size and r["max_in_flight"] == window]
                cells.append(format_rate(match[0]["rows_per_s_median"]) if match else "–")
            lines.append(f"| {size:g} MiB | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def markdown(results: dict[str, Any]) -> str:
    """Every table of the run as Markdown: comparison per server config, profile, sweep."""
    env = results["environment"]
    lines = [f"# TritonModel vs coffea's triton_wrapper, transport-bound model ({env['date']})",
             "",
             f"{env['cpu_count']} cores ({env['cpu_model']}), shared with other jobs: load "
             f"average {env['load_before']} before, {env['load_after']} after. "
             f"{ROWS:,} rows per call of 16 FP32 -> 2 FP32 (12.8 MB in, 1.6 MB out), one "
             "python-backend instance, loopback; clients take turns call by call.", ""]
    for run in results["runs"]:
        config = run["config"]
        lines += [f"## max_batch_size {config['max_batch_size']}, dynamic batching "
                  f"{'on' if config['dynamic_batching'] else 'off'}, {config['rounds']} calls "
                  "per client", ""]
        lines += _comparison_table(run)
        if run.get("serial_breakdown"):
            lines += ["", "One request in flight (``max_in_flight=1``), ms per call:", ""]
            lines += _serial_table(run["serial_breakdown"])
        if run.get("sweep"):
            lines += ["", "TritonModel knobs (``max_request_bytes`` x ``max_in_flight``):", ""]
            lines += _sweep_tables(run["sweep"])
        lines.append("")
    for client_name, profile in results.get("profiles", {}).items():
        lines += [f"py-spy, calling thread of ``{client_name}`` ({profile['ms_per_call']:.1f} ms per "
                  f"call while sampled), share of its samples, inclusive:", ""]
        # frames under which (nearly) every sample lies (the loop, __call__) say nothing
        telling = [(name, share) for name, share in profile["inclusive"] if share < 0.95]
        lines += [f"- {share:.0%} {name}" for name, share in telling[:8]]
        lines += ["", "self:", ""]
        lines += [f"- {share:.0%} {name}" for name, share in profile["self"][:8]]
        lines.append("")
    steps = results.get("client_steps", {})
    if steps:
        lines += [f"Client-side steps for one {steps['piece_rows']}-row request "
                  f"({steps['piece_bytes'] / MiB:.1f} MiB) in isolation, best of 15, ms:", ""]
        lines += [f"- {key}: {value:.2f}" if isinstance(value, float) else f"- {key}: {value}"
                  for key, value in steps.items() if key not in ("piece_rows", "piece_bytes")]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    """Bars of rows/s per client and server config (ratio to the wrapper on top), sweep heat maps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    records = [r for run in runs for r in run.get("sweep", [])]
    transports = sorted({r["transport"] for r in records})
    figure, axes = plt.subplots(1, 1 + len(transports),
                                figsize=(7 + 5 * len(transports), 5), squeeze=False)
    bars = axes[0][0]
    names = [r["client"] for r in runs[0]["comparison"] if "error" not in r]
    width = 0.8 / len(runs)
    for index, run in enumerate(runs):
        rows = {r["client"]: r for r in run["comparison"] if "error" not in r}
        positions = np.arange(len(names)) + (index - (len(runs) - 1) / 2) * width
        values = np.array([rows[n]["rows_per_s_median"] / 1e6 if n in rows else np.nan
                           for n in names])
        spread = np.array([[(rows[n]["rows_per_s_median"] - rows[n]["rows_per_s_p25"]) / 1e6,
                            (rows[n]["rows_per_s_p75"] - rows[n]["rows_per_s_median"]) / 1e6]
                           if n in rows else [0, 0] for n in names]).T
        bars.bar(positions, values, width, yerr=spread, capsize=2,
                 label=f"max_batch_size {run['config']['max_batch_size']}")
        for x, name, value in zip(positions, names, values):
            ratio = rows.get(name, {}).get("ratio_to_wrapper")
            if ratio:
                bars.text(x, value, f"{ratio:.1f}x", ha="center", va="bottom", fontsize=7)
    bars.set_xticks(range(len(names)), [textwrap.fill(n.replace("prototype: ", "proto: "), 13)
                                        for n in names], fontsize=7)
    bars.set_ylabel("M rows/s (median; bars p25-p75)")
    bars.set_title(f"{ROWS:,} rows per call, clients at defaults")
    bars.legend(fontsize=8)
    for axis, transport in zip(axes[0][1:], transports):
        mine = [r for r in records if r["transport"] == transport]
        windows = sorted({r["max_in_flight"] for r in mine})
        sizes = sorted({r["max_request_mib"] for r in mine})
        grid = np.full((len(sizes), len(windows)), np.nan)
        for r in mine:
            grid[sizes.index(r["max_request_mib"]), windows.index(r["max_in_flight"])] = \
                r["rows_per_s_median"] / 1e6
        image = axis.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
        for (i, j), value in np.ndenumerate(grid):
            if np.isfinite(value):
                axis.text(j, i, f"{value:.1f}", ha="center", va="center", color="w", fontsize=8)
        axis.set_xticks(range(len(windows)), [str(w) for w in windows])
        axis.set_yticks(range(len(sizes)), [f"{s:g}" for s in sizes])
        axis.set_xlabel("max_in_flight")
        axis.set_ylabel("max_request_bytes (MiB)")
        swept = [run["config"]["max_batch_size"] for run in runs if run.get("sweep")]
        axis.set_title(f"TritonModel {transport}, max_batch_size {swept[0]}: M rows/s",
                       fontsize=10)
        figure.colorbar(image, ax=axis)
    env = results["environment"]
    figure.suptitle(f"{env['cpu_count']}-core CPU, {env['date']}, load before {env['load_before']}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def environment() -> dict[str, Any]:
    """Date, machine, versions and the load average before the run."""
    import coffea
    import tritonclient

    from coffea_sonic.bench.machine import cpu_model

    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu_count": os.cpu_count(), "cpu_model": cpu_model(),
            "python": platform.python_version(), "numpy": np.__version__,
            "coffea": getattr(coffea, "__version__", "?"),
            "tritonclient": getattr(tritonclient, "__version__", "?"),
            "load_before": ", ".join(f"{x:.2f}" for x in os.getloadavg())}


def measure_config(args: argparse.Namespace, max_batch_size: int, inputs: dict[str, np.ndarray],
                   workdir: Path, with_sweep: bool) -> dict[str, Any]:
    """Everything measured against one server config: comparison, serial breakdown, sweep."""
    import tritonclient.grpc as grpcclient

    from coffea_sonic.server import LocalTritonServer

    dynamic = not args.no_dynamic_batching
    repository = write_repository(workdir / f"models-{max_batch_size}", max_batch_size, dynamic)
    run: dict[str, Any] = {"config": {"max_batch_size": max_batch_size, "dynamic_batching": dynamic,
                                      "rounds": args.rounds, "server_instances": 1}}
    with LocalTritonServer(repository=repository, device="cpu") as server:
        url = server.url(MODEL)
        http_url = f"triton+http://{server.http_address}/{MODEL}"
        stats_client = grpcclient.InferenceServerClient(server.grpc_address)
        clients = [wrapper_client(server.grpc_address),
                   tritonmodel_client("grpc", url, transport="grpc"),
                   tritonmodel_client("shm", url, transport="shm"),
                   tritonmodel_client("auto (default)", url),
                   tritonmodel_client("http", http_url, transport="http"),
                   framed_client(server.grpc_address, 4 * MiB, 4, 1),
                   framed_client(server.grpc_address, 1 * MiB, 8, 2)]
        usable = [client for client in clients if client.error is None]
        for client in clients:
            if client.error:
                logger.warning("%s not measured: %s", client.name, client.error)
        for client in usable:  # warm-up, and proof that every client gets the right answer
            check_outputs(client, inputs)
            client.call(inputs)
        logger.info("max_batch_size %d: %d calls each of %s, round-robin", max_batch_size,
                    args.rounds, ", ".join(c.name for c in usable))
        timings = round_robin(usable, inputs, args.rounds, stats_client)
        wrapper = timings.get("coffea-wrapper")
        comparison = []
        for client in clients:
            if client.error:
                comparison.append({"client": client.name, "error": client.error})
                continue
            row = summarize(client.name, timings[client.name],
                            wrapper if client.name != "coffea-wrapper" else None)
            row["sent"] = client.describe()
            comparison.append(row)
            client.close()
        run["comparison"] = comparison
        run["timings_s"] = {name: timing.seconds for name, timing in timings.items()}
        logger.info("profile: one request in flight")
        run["serial_breakdown"] = serial_breakdown(url, inputs, stats_client,
                                                   calls=max(5, args.rounds // 3))
        if with_sweep and args.sweep_rounds > 0:
            logger.info("sweep of max_request_bytes x max_in_flight")
            run["sweep"] = sweep({"grpc": url, "http": http_url}, inputs, ["grpc", "shm", "http"],
                                 [float(size) for size in args.sweep_mib.split(",")],
                                 [int(window) for window in args.sweep_in_flight.split(",")],
                                 args.sweep_rounds)
        stats_client.close()
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/cpu2-transport")
    parser.add_argument("--rounds", type=int, default=40, help="timed calls per client")
    parser.add_argument("--max-batch-size", default="65536,262144",
                        help="the model's max_batch_size, one server config each (comma list); "
                             "65536 is TRITON-NOTES' config, the larger one lets requests be "
                             "capped by bytes only and is the one swept")
    parser.add_argument("--no-dynamic-batching", action="store_true",
                        help="no dynamic_batching block in the model config")
    parser.add_argument("--sweep-rounds", type=int, default=12, help="0 skips the sweep")
    parser.add_argument("--sweep-mib", default="1,2,4,8,16")
    parser.add_argument("--sweep-in-flight", default="1,2,4,8")
    parser.add_argument("--py-spy", metavar="PATH",
                        help="py-spy binary: also sample where each client's calling thread "
                             "spends its time (wrapper, grpc, shm; max_batch_size 65536)")
    parser.add_argument("--profile-seconds", type=float, default=12.0)
    parser.add_argument("--profile-child", help=argparse.SUPPRESS)
    parser.add_argument("--ready", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("coffea_sonic").setLevel(logging.WARNING)
    if args.profile_child:
        loop_for_profile(args.profile_child, int(args.max_batch_size), args.profile_seconds,
                         args.ready)
        return 0

    env = environment()
    inputs = {"x": np.random.default_rng(0).standard_normal((ROWS, FEATURES)).astype(np.float32)}
    workdir = Path(tempfile.mkdtemp(prefix="wrapper-vs-tritonmodel-"))
    sizes = [int(size) for size in args.max_batch_size.split(",")]
    results: dict[str, Any] = {
        "environment": env,
        "workload": {"rows": ROWS, "features": FEATURES, "outputs": KEPT, "model": MODEL},
        "client_steps": client_steps(inputs, 4 * MiB // (FEATURES * 4), repeats=15),
        "runs": [measure_config(args, size, inputs, workdir, with_sweep=size == max(sizes))
                 for size in sizes]}
    if args.py_spy:
        logger.info("sampling profiles with %s", args.py_spy)
        results["profiles"] = sampling_profiles(args.py_spy, min(sizes), args.profile_seconds)
    env["load_after"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    text = markdown(results)
    (args.out / "results.md").write_text(text)
    plot(results, args.out / "wrapper_vs_tritonmodel.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
