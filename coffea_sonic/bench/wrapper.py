"""TritonModel against coffea's ``triton_wrapper`` on a transport-bound model, all in one run.

``coffea-sonic bench wrapper`` runs it (:mod:`coffea_sonic.bench.commands.wrapper`). The model
(``slice16``, Triton's python backend) returns the first 2 of 16 float32 inputs per row, so a
call's time is the transport's: client encoding, the wire or shared memory, Triton's copies into
and out of the python backend, and decoding. Every call sends ``rows`` rows (200 000: 12.8 MB
in, 1.6 MB out) to an embedded :class:`~coffea_sonic.server.LocalTritonServer` on loopback, one
server per ``max_batch_size`` of the model.

Clients, each at its defaults (the only argument given is the transport):

==================  ==============================================================================
``coffea-wrapper``  ``coffea.ml_tools.triton_wrapper(...).numpy_call`` (``ssl=False``: the server
                    speaks plain gRPC); it pads every request to the batch size it resolves from the
                    server's config and sends one request at a time
``grpc``            ``TritonModel(url, transport="grpc")``
``shm``             ``TritonModel(url, transport="shm")``
``auto (default)``  ``TritonModel(url)`` (what a user gets; shared memory on this host)
``http``            ``TritonModel(http_url, transport="http")`` (``triton+http://`` the HTTP port)
==================  ==============================================================================

They take turns call by call (:mod:`.wrapper_clients`), so a change in the machine's load hits
all alike; each ratio is from this one run. Then, for the profile: Triton's statistics around
every timed call; the client-side steps of one 4 MiB request in isolation
(:func:`~.wrapper_profile.client_steps`); one request at a time (:func:`serial_breakdown`); a
sweep of ``max_request_bytes`` x ``max_in_flight`` (:func:`sweep`); with py-spy, a sampling
profile of each client's calling thread (:mod:`.wrapper_profile`). :func:`write_wrapper` writes
results.json, results.md and wrapper_vs_tritonmodel.png (:mod:`.wrapper_report`).

>>> WrapperBench().max_batch_sizes
[65536, 262144]
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .machine import cpu_model, package_versions
from .wrapper_clients import (FEATURES, KEPT, MODEL, STAT_KEYS, Client, check_outputs,
                              round_robin, slice_inputs, summarize, tritonmodel_client,
                              wrapper_client, write_repository)

__all__ = ["WrapperBench", "run_wrapper", "serial_breakdown", "sweep"]

logger = logging.getLogger(__name__)

MiB = 1 << 20


@dataclass
class WrapperBench:
    """One run: the model configs (one server each), calls per client, the sweep, py-spy."""

    max_batch_sizes: list[int] = field(default_factory=lambda: [65536, 262144])
    dynamic_batching: bool = True
    rows: int = 200_000
    rounds: int = 40
    #: calls per configuration of the sweep (0: no sweep); it runs on the largest max_batch_size
    sweep_rounds: int = 12
    sweep_mib: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0, 16.0])
    sweep_in_flight: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    #: py-spy binary (None: no sampling profile), on the smallest max_batch_size
    py_spy: str | None = None
    profile_seconds: float = 12.0


def environment() -> dict[str, Any]:
    """Date, machine, versions and the load average before the run."""
    versions = package_versions(("coffea", "tritonclient", "numpy"))
    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu_count": os.cpu_count(), "cpu_model": cpu_model(),
            "python": sys.version.split()[0], **{k: v or "?" for k, v in versions.items()},
            "command": " ".join(sys.argv),
            "load_before": ", ".join(f"{x:.2f}" for x in os.getloadavg())}


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


def _sweep_clients(urls: dict[str, str], inputs: dict[str, np.ndarray], config: WrapperBench
                   ) -> tuple[list[Client], dict[str, tuple[str, float, int]]]:
    """A warm TritonModel client per (transport, size, window) of the sweep that can work."""
    clients, settings = [], {}
    for transport in ("grpc", "shm", "http"):
        url = urls["http" if transport == "http" else "grpc"]
        for size in config.sweep_mib:
            for window in config.sweep_in_flight:
                name = f"{transport} {size:g} MiB x{window}"
                client = tritonmodel_client(name, url, transport=transport,
                                            max_request_bytes=int(size * MiB), max_in_flight=window)
                if client.error:
                    logger.warning("sweep: %s not measured: %s", name, client.error)
                    continue
                client.call(inputs)  # warm (shm regions sized, channel open)
                clients.append(client)
                settings[name] = (transport, size, window)
    return clients, settings


def sweep(urls: dict[str, str], inputs: dict[str, np.ndarray],
          config: WrapperBench) -> list[dict[str, Any]]:
    """rows/s for every (transport, max_request_bytes, max_in_flight), taking turns per round;
    ``urls``: the model's URL per protocol (``grpc``, ``http``)."""
    clients, settings = _sweep_clients(urls, inputs, config)
    timings = round_robin(clients, inputs, config.sweep_rounds, None)
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


def _clients(server: Any, rows: int) -> list[Client]:
    url = server.url(MODEL)
    http_url = f"triton+http://{server.http_address}/{MODEL}"
    return [wrapper_client(server.grpc_address, rows),
            tritonmodel_client("grpc", url, transport="grpc"),
            tritonmodel_client("shm", url, transport="shm"),
            tritonmodel_client("auto (default)", url),
            tritonmodel_client("http", http_url, transport="http")]


def compare(clients: list[Client], inputs: dict[str, np.ndarray], rounds: int,
            stats_client: Any) -> dict[str, Any]:
    """Check every client's answer, then time them round-robin; the comparison rows (a client
    that cannot work is a row with its error) and every call's seconds."""
    usable = [client for client in clients if client.error is None]
    for client in clients:
        if client.error:
            logger.warning("%s not measured: %s", client.name, client.error)
    for client in usable:  # warm-up, and proof that every client gets the right answer
        check_outputs(client, inputs)
        client.call(inputs)
    timings = round_robin(usable, inputs, rounds, stats_client)
    wrapper = timings.get("coffea-wrapper")
    rows = len(inputs["x"])
    comparison = []
    for client in clients:
        if client.error:
            comparison.append({"client": client.name, "error": client.error})
            continue
        row = summarize(client.name, timings[client.name],
                        wrapper if client.name != "coffea-wrapper" else None, rows)
        comparison.append({**row, "sent": client.describe()})
        client.close()
    return {"comparison": comparison,
            "timings_s": {name: timing.seconds for name, timing in timings.items()}}


def measure_config(config: WrapperBench, max_batch_size: int, inputs: dict[str, np.ndarray],
                   workdir: Path, with_sweep: bool) -> dict[str, Any]:
    """Everything measured against one server config: comparison, serial breakdown, sweep."""
    import tritonclient.grpc as grpcclient

    from ..server import LocalTritonServer

    repository = write_repository(workdir / f"models-{max_batch_size}", max_batch_size,
                                  config.dynamic_batching)
    run: dict[str, Any] = {"config": {"max_batch_size": max_batch_size,
                                      "dynamic_batching": config.dynamic_batching,
                                      "rounds": config.rounds, "server_instances": 1}}
    with LocalTritonServer(repository=repository, device="cpu") as server:
        stats_client = grpcclient.InferenceServerClient(server.grpc_address)
        try:
            logger.info("max_batch_size %d: %d calls per client, round-robin", max_batch_size,
                        config.rounds)
            run.update(compare(_clients(server, config.rows), inputs, config.rounds,
                               stats_client))
            run["serial_breakdown"] = serial_breakdown(
                server.url(MODEL), inputs, stats_client, max(5, config.rounds // 3))
            if with_sweep and config.sweep_rounds > 0:
                urls = {"grpc": server.url(MODEL),
                        "http": f"triton+http://{server.http_address}/{MODEL}"}
                run["sweep"] = sweep(urls, inputs, config)
        finally:
            stats_client.close()
    return run


def run_wrapper(config: WrapperBench) -> dict[str, Any]:
    """Every server config of ``config``, the client-side steps and (with py-spy) the profiles."""
    from .wrapper_profile import client_steps, require_py_spy, sampling_profiles

    py_spy = require_py_spy(config.py_spy) if config.py_spy else None
    env = environment()
    inputs = slice_inputs(config.rows)
    workdir = Path(tempfile.mkdtemp(prefix="wrapper-vs-tritonmodel-"))
    largest = max(config.max_batch_sizes)
    results: dict[str, Any] = {
        "environment": env,
        "workload": {"rows": config.rows, "features": FEATURES, "outputs": KEPT, "model": MODEL},
        "client_steps": client_steps(inputs, 4 * MiB // (FEATURES * 4), repeats=15),
        "runs": [measure_config(config, size, inputs, workdir, with_sweep=size == largest)
                 for size in config.max_batch_sizes]}
    if py_spy:
        logger.info("sampling profiles with %s", py_spy)
        results["profiles"] = sampling_profiles(py_spy, min(config.max_batch_sizes),
                                                config.profile_seconds, config.rows)
    env["load_after"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return results
