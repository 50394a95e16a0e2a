"""Served vs in-process throughput on one GPU: the defaults check and the sweep behind it.

Every client is its own (spawned) process that loops on fixed chunks: ``model(chunk)`` with
``TritonModel`` (or ``GpuEngine(model)(chunk)`` in-process), synchronously, as an analysis worker
does. All clients of a run start together; a client's rate is its answered rows over the time to its
last answer, and a run's rate is the sum. During each served run: GPU busy (``nvidia-smi``
utilization.gpu sampled every 100 ms, mean over the run) and Triton's statistics per request
(queue, compute input / infer / output, average executed batch), plus TritonModel's own latency per
request. The in-process baselines run in the same command on the same GPU.

Plans:

``final``
    the targets at DEFAULTS: ``LocalTritonServer(models=..., device="gpu")`` and
    ``TritonModel(url)``, no options: emtrk_cnn 2048-row chunks with 1 and 8 (and 16) client
    processes vs one in-process ``GpuEngine`` on 2048-row chunks; jet_tagger 65 536-row chunks with
    8 processes vs in-process; every ratio from this one run.
``sweep``, ``sweep2``, ``cuda``
    what chose the defaults: request size (``max_request_bytes``) x requests in flight
    (``max_in_flight``) per transport, model instances per GPU, the dynamic batcher's queue delay,
    the python-backend model's copy threads and GPU inputs, and CUDA shared memory from host
    arrays, each with explicit options (H100 results and notes: ``results-defaults/``).
``smoke``
    a few seconds of every code path with jet_tagger (``--device cpu`` works).

    python benchmarks/gpu/defaults_sweep.py --plan final --out $OUT      # on the GPU machine
    bash benchmarks/gpu/defaults_check.sh                                # same, self-contained

The JSON (``defaults-<plan>.json``) holds the machine (card, cores), every run's configuration,
per-process rates, GPU samples' mean and the server profile; a markdown table is printed last and
written beside it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coffea_sonic.bench.client import max_abs_difference
from coffea_sonic.bench.clients import ClientPool
from coffea_sonic.bench.machine import machine_info
from coffea_sonic.bench.report import format_rate


HERE = Path(__file__).resolve().parent
logger = logging.getLogger("defaults_sweep")

MiB = 1 << 20
#: Rows per chunk, per model (the issue's workloads).
CHUNK_ROWS = {"emtrk_cnn": 2048, "jet_tagger": 65536}


@dataclass
class Run:
    """One measurement: ``procs`` client processes of ``kind`` on ``model``."""

    kind: str  # "local" (GpuEngine), "triton" (TritonModel), "cuda-host" (CudaShmTransport, numpy)
    model: str
    procs: int = 1
    client: dict = field(default_factory=dict)  # TritonModel keyword arguments
    label: str = ""
    duration: float | None = None


@dataclass
class Server:
    """One server configuration (None: no server, in-process runs only)."""

    name: str
    instances: int | None = None  # None: LocalTritonServer's default
    options: dict = field(default_factory=dict)  # repository_options
    runs: list[Run] = field(default_factory=list)
    default: bool = False  # LocalTritonServer(models, device="gpu") with nothing else


def _t(model: str, procs: int, mrb_mib: float | None = None, mif: int | None = None,
       transport: str | None = None) -> Run:
    client: dict[str, Any] = {}
    if mrb_mib is not None:
        client["max_request_bytes"] = int(mrb_mib * MiB)
    if mif is not None:
        client["max_in_flight"] = mif
    if transport is not None:
        client["transport"] = transport
    return Run("triton", model, procs, client)


def _grpc(procs: int, mrb: float | None = None, mif: int | None = None,
          connections: int = 1) -> Run:
    """emtrk_cnn over gRPC (forced) from ``procs`` processes, ``connections`` per server."""
    run = _t("emtrk_cnn", procs, mrb, mif, "grpc")
    run.client["connections"] = connections
    return run


def _grid(procs: int, cells: list[tuple[float, int]], transport: str = "shm") -> list[Run]:
    return [_t("emtrk_cnn", procs, mrb, mif, transport) for mrb, mif in cells]


def plan_final(include_16: bool = True) -> list[Server]:
    baselines = Server("in-process", runs=[Run("local", "emtrk_cnn"), Run("local", "jet_tagger")])
    served = [Run("verify", "emtrk_cnn"), Run("verify", "jet_tagger"),
              Run("triton", "emtrk_cnn", 1), Run("triton", "emtrk_cnn", 8)]
    if include_16:
        served.append(Run("triton", "emtrk_cnn", 16))
    served.append(Run("triton", "jet_tagger", 8))
    # beside the defaults: system shared memory for GPU models too (the default until
    # 2026-11-26, when auto began to choose CUDA memory where the client has CUDA)
    served += [_t("emtrk_cnn", 1, transport="shm"), _t("emtrk_cnn", 8, transport="shm")]
    return [baselines, Server("defaults", default=True, runs=served),
            Server("in-process again", runs=[Run("local", "emtrk_cnn")])]


def plan_sweep() -> list[Server]:
    """In order of importance (the script stops starting runs when its time budget is spent)."""
    # emtrk_cnn rows are 9216 B: 2.25 MiB = 256 rows (8 pieces of a 2048-row chunk), 4 MiB = 455
    # (4 + a 228-row tail), 4.5 MiB = 512 (4 equal pieces), 9 MiB = 1024 (2), 16 MiB = 1777
    # (+ 271), 64 MiB = the whole chunk in one request
    one = [(2.25, 4), (2.25, 8), (4, 1), (4, 2), (4, 4), (4.5, 1), (4.5, 2), (4.5, 4), (9, 1), (9, 2),
           (9, 4), (16, 1), (16, 2), (16, 4), (64, 1)]
    eight = [(2.25, 4), (4, 2), (4, 4), (4.5, 2), (4.5, 4), (9, 1), (9, 2), (16, 1), (16, 2),
             (64, 1), (64, 2)]
    check = Run("verify", "emtrk_cnn", client={"max_request_bytes": int(4.5 * MiB)})
    i4 = Server("4 instances", 4, runs=(
        [check] + _grid(1, one) + _grid(8, eight)
        + [_t("jet_tagger", 8, 4, 4), _t("jet_tagger", 8, 64, 2),
           _t("emtrk_cnn", 1, 4, 4, "grpc"), _t("emtrk_cnn", 1, 2.25, 4, "grpc"),
           _t("emtrk_cnn", 8, 4, 2, "grpc"), _t("emtrk_cnn", 8, 2.25, 4, "grpc")]))
    i4_copy = Server("4 instances, copy_threads 4", 4, {"copy_threads": 4}, runs=(
        [check, Run("verify", "emtrk_cnn", client={"max_request_bytes": 64 * MiB})]
        + _grid(1, [(4, 4), (4.5, 4), (9, 2), (64, 1), (2.25, 8)])
        + _grid(8, [(4, 4), (4.5, 2), (9, 2), (64, 1)]) + [_t("jet_tagger", 8, 4, 4)]))
    i2 = Server("2 instances", 2, runs=(
        _grid(1, [(4, 4), (4.5, 2), (9, 2), (64, 1), (2.25, 4)])
        + _grid(8, [(4, 4), (4.5, 2), (9, 2), (64, 1)])))
    i1 = Server("1 instance", 1, runs=(
        _grid(1, [(4, 4), (9, 2), (64, 1)]) + _grid(8, [(4, 4), (9, 2), (64, 1)])))
    i6 = Server("6 instances", 6, runs=(
        _grid(1, [(4, 4), (2.25, 8), (4.5, 4)]) + _grid(8, [(4, 4), (4.5, 2), (9, 2)])
        + [_t("jet_tagger", 8, 4, 4)]))
    delay0 = Server("4 instances, queue delay 0", 4, {"max_queue_delay_microseconds": 0}, runs=(
        _grid(1, [(4, 4), (4.5, 4)]) + _grid(8, [(4, 4), (9, 2)])))
    delay1k = Server("4 instances, queue delay 1 ms, preferred 4096", 4,
                     {"max_queue_delay_microseconds": 1000, "preferred_batch_sizes": [4096]},
                     runs=_grid(1, [(4, 4)]) + _grid(8, [(4, 4), (9, 2)]))
    gpuin = Server("4 instances, GPU inputs", 4, {"gpu_input_tensors": True}, runs=[
        Run("cuda-host", "emtrk_cnn", 1), Run("cuda-host", "emtrk_cnn", 8)])
    baselines = Server("in-process", runs=[Run("local", "emtrk_cnn"), Run("local", "jet_tagger")])
    return [baselines, i4, i4_copy, i2, i1, delay0, i6, delay1k, gpuin,
            Server("in-process again", runs=[Run("local", "emtrk_cnn")])]


def plan_sweep2() -> list[Server]:
    """Second pass (after the TorchScript export in full fp32): instances 4/6/8 with GPU inputs
    allowed and copy threads, system shm vs CUDA shm from host arrays, and today's defaults."""
    check = Run("verify", "emtrk_cnn", client={"max_request_bytes": int(4.5 * MiB)})
    gpu_in = {"gpu_input_tensors": True, "copy_threads": 4}
    cuda = [Run("cuda-host", "emtrk_cnn", 1), Run("cuda-host", "emtrk_cnn", 8),
            Run("cuda-host", "jet_tagger", 8)]
    return [
        Server("in-process", runs=[Run("local", "emtrk_cnn"), Run("local", "jet_tagger")]),
        Server("4 instances (fp32 export)", 4, runs=(
            [check] + _grid(1, [(2.25, 8), (4.5, 4), (64, 1)]) + _grid(8, [(9, 1), (9, 2), (4.5, 2)])
            + [_t("jet_tagger", 8, 4, 4)])),
        Server("4 instances, GPU inputs, copy_threads 4", 4, gpu_in, runs=(
            [check] + _grid(1, [(2.25, 8), (9, 2)]) + _grid(8, [(9, 1), (9, 2), (64, 1)])
            + [_t("jet_tagger", 8, 4, 4)] + cuda)),
        Server("6 instances, GPU inputs, copy_threads 4", 6, gpu_in, runs=(
            _grid(1, [(2.25, 8)]) + _grid(8, [(9, 1), (9, 2)]) + [_t("jet_tagger", 8, 4, 4)] + cuda)),
        Server("8 instances, GPU inputs, copy_threads 4", 8, gpu_in, runs=(
            _grid(1, [(2.25, 8)]) + _grid(8, [(9, 1), (9, 2)]) + [_t("jet_tagger", 8, 4, 4)]
            + cuda[1:])),
        Server("defaults", default=True, runs=[Run("triton", "emtrk_cnn", 1),
                                               Run("triton", "emtrk_cnn", 8),
                                               Run("triton", "jet_tagger", 8)]),
        Server("in-process again", runs=[Run("local", "emtrk_cnn"), Run("local", "jet_tagger")]),
    ]


def plan_cuda() -> list[Server]:
    """CUDA shared memory from host arrays, the chunk sent as 1, 2 or 4 pieces in flight."""
    gpu_in = {"gpu_input_tensors": True, "copy_threads": 4}

    def cuda(model, procs, pieces):
        return Run("cuda-host", model, procs, {"pieces": pieces})

    return [
        Server("in-process", runs=[Run("local", "emtrk_cnn"), Run("local", "jet_tagger")]),
        Server("4 instances, GPU inputs, copy_threads 4", 4, gpu_in, runs=[
            cuda("emtrk_cnn", 1, 1), cuda("emtrk_cnn", 1, 2), cuda("emtrk_cnn", 1, 4),
            cuda("emtrk_cnn", 8, 2), cuda("emtrk_cnn", 8, 4), cuda("jet_tagger", 8, 1),
            _t("emtrk_cnn", 1, 2.25, 8)]),
    ]


def plan_one() -> list[Server]:
    """One client process, default server: the request size and window of the default client
    (CUDA memory where the client has CUDA) against smaller pieces in flight."""
    return [Server("in-process", runs=[Run("local", "emtrk_cnn")]),
            Server("defaults", default=True, runs=[
                Run("triton", "emtrk_cnn", 1), _t("emtrk_cnn", 1, 10, 2), _t("emtrk_cnn", 1, 5, 4),
                _t("emtrk_cnn", 1, 5, 2), Run("triton", "emtrk_cnn", 8), _t("emtrk_cnn", 8, 10, 2)]),
            Server("in-process again", runs=[Run("local", "emtrk_cnn")])]


def plan_smoke() -> list[Server]:
    """A few seconds of every code path with jet_tagger only (any machine, ``--device cpu`` too)."""
    return [Server("in-process", runs=[Run("local", "jet_tagger")]),
            Server("defaults", default=True,
                   runs=[Run("verify", "jet_tagger"), Run("triton", "jet_tagger", 1)]),
            Server("2 instances, queue delay 0", 2, {"max_queue_delay_microseconds": 0},
                   runs=[_t("jet_tagger", 2, 0.5, 2), _t("jet_tagger", 1, 4, 4, "grpc")])]


def plan_gpus() -> list[Server]:
    """Several GPUs: the default server uses every visible GPU; aggregate served rows/s
    against one process in-process on one GPU (goal: >= 0.9 x N GPUs). Client processes scale
    with the machine (about 14 per GPU, leaving cores to the server)."""
    cores = os.cpu_count() or 16
    counts = sorted({8, 16, cores // 2, max(8, cores - 4)})
    return [Server("in-process (one GPU)", runs=[Run("local", "emtrk_cnn")]),
            Server("defaults, every GPU", default=True,
                   runs=[Run("verify", "emtrk_cnn")]
                   + [Run("triton", "emtrk_cnn", n) for n in counts]),
            Server("in-process again", runs=[Run("local", "emtrk_cnn")])]


def plan_wire() -> list[Server]:
    """The gRPC path and one process: the default client beside gRPC forced with 1, 2
    and 4 connections per server, smaller requests, 8 processes, and CUDA memory with the chunk
    in 2 or 4 pieces (the next piece's host-to-device copy overlapping the current request)."""
    def grpc(procs: int, connections: int, mrb: float | None = None, mif: int | None = None):
        run = _t("emtrk_cnn", procs, mrb, mif, "grpc")
        run.client["connections"] = connections
        return run

    return [Server("in-process", runs=[Run("local", "emtrk_cnn")]),
            Server("defaults", default=True, runs=[
                Run("verify", "emtrk_cnn"), Run("triton", "emtrk_cnn", 1),
                _t("emtrk_cnn", 1, 10, 2), _t("emtrk_cnn", 1, 5, 4),
                grpc(1, 1), grpc(1, 2), grpc(1, 4), grpc(1, 4, 2.25, 8), grpc(1, 2, 9, 2),
                Run("triton", "emtrk_cnn", 8), grpc(8, 1), grpc(8, 2), grpc(8, 4),
                _t("emtrk_cnn", 1, transport="shm"), _t("emtrk_cnn", 8, transport="shm")]),
            Server("in-process again", runs=[Run("local", "emtrk_cnn")])]


def plan_wire2() -> list[Server]:
    """The gRPC default (2 MiB x 4) beside other request sizes and windows, 1 and 8 processes."""
    grpc = _grpc
    return [Server("in-process", runs=[Run("local", "emtrk_cnn")]),
            Server("defaults", default=True, runs=[
                grpc(1), grpc(1, 2, 8), grpc(1, 2.25, 8), grpc(1, 1, 8), grpc(1, 2, 8, 4),
                grpc(8), grpc(8, 2, 8), grpc(8, 9, 2), grpc(8, 32, 1), Run("triton", "emtrk_cnn", 1)]),
            Server("in-process again", runs=[Run("local", "emtrk_cnn")])]


def plan_accept() -> list[Server]:
    """The one-process rows of the acceptance list: the default client (CUDA memory), gRPC forced
    at its default, at 2.25 MiB x 8 over 4 connections (best one-process row so far) and at a
    candidate default between the two (4.5 MiB x 4, 4 connections), the last and the default
    from 8 processes too (a gRPC default must keep 8 processes >= 0.85x)."""
    grpc = _grpc
    return [Server("in-process", runs=[Run("local", "emtrk_cnn")]),
            Server("defaults", default=True, runs=[
                Run("verify", "emtrk_cnn"), Run("triton", "emtrk_cnn", 1), grpc(1),
                grpc(1, 2.25, 8, 4), grpc(1, 4.5, 4, 4), grpc(8), grpc(8, 4.5, 4, 4)]),
            Server("in-process again", runs=[Run("local", "emtrk_cnn")])]


PLANS = {"accept": plan_accept, "final": plan_final, "wire": plan_wire, "wire2": plan_wire2, "one": plan_one, "gpus": plan_gpus, "sweep": plan_sweep, "sweep2": plan_sweep2, "cuda": plan_cuda,
         "smoke": plan_smoke}


# -- client processes -------------------------------------------------------------------------------

def _make_runner(task: dict, cache: dict):
    from coffea_sonic import zoo

    kind, model = task["kind"], task["model"]
    if kind == "local":
        key = ("local", model, task["device"])
        if key not in cache:
            from coffea_sonic.engines import CpuEngine, GpuEngine

            cache[key] = GpuEngine(model) if task["device"] == "gpu" else CpuEngine(model)
        return cache[key], None
    if kind == "triton":
        from coffea_sonic import TritonModel
        from coffea_sonic.routing import clear_routers
        from coffea_sonic.transport.registry import close_all_transports

        options = dict(task["client"])
        connections = str(options.pop("connections", ""))
        if connections != os.environ.get("COFFEA_SONIC_GRPC_CONNECTIONS", ""):
            # the process' pooled transports were made with the previous count
            clear_routers()
            close_all_transports()
            os.environ["COFFEA_SONIC_GRPC_CONNECTIONS"] = connections
            if not connections:
                del os.environ["COFFEA_SONIC_GRPC_CONNECTIONS"]
        client = TritonModel(task["url"], timeout_s=120, **options)
        return client, client
    if kind == "cuda-host":
        from coffea_sonic.transport.shm import CudaShmTransport

        key = ("cuda", task["grpc"])
        if key not in cache:
            cache[key] = CudaShmTransport(task["grpc"])
        transport = cache[key]
        from coffea_sonic.transport.base import InferRequest

        outputs = zoo.declared_info(model).outputs
        pieces = int(task["client"].get("pieces", 1))

        def call(inputs):
            # equal pieces, all sent before the first answer is awaited (the next piece's
            # host-to-device copy overlaps the server's work on the previous one); host arrays
            # in, host arrays out
            rows = len(next(iter(inputs.values())))
            bounds = [rows * part // pieces for part in range(pieces + 1)]
            futures = [transport.submit(InferRequest(
                model, "", {k: v[a:b] for k, v in inputs.items()}, outputs, rows=b - a,
                timeout_s=120)) for a, b in zip(bounds[:-1], bounds[1:])]
            answers = [future.result().outputs for future in futures]
            return {name: np.concatenate([a[name] for a in answers]) for name in answers[0]}

        return call, None
    raise ValueError(f"unknown run kind {kind!r}")


def _client_stats(client) -> dict:
    stats = getattr(client, "stats", None)
    return {name: getattr(stats, name, 0) for name in ("requests", "latency_s", "wait_s", "retries",
                                                       "failed_requests", "fallback_rows")}


def _verify(task: dict, cache: dict) -> dict:
    """max |served - in-process| on one chunk (TritonModel at the run's options vs the engine)."""
    from coffea_sonic import TritonModel, zoo

    inputs = zoo.example_inputs(task["model"], task["rows"], seed=99)
    local, _ = _make_runner(dict(task, kind="local"), cache)
    reference = local(inputs)
    client = TritonModel(task["url"], timeout_s=120, **task["client"])
    served = client(inputs)
    client.close()
    return {"max_abs_diff": max_abs_difference(served, reference)}


def _run_task(task: dict, tasks, control, cache: dict) -> dict:
    from coffea_sonic import zoo

    rows = task["rows"]
    if task["kind"] == "verify":
        result = _verify(task, cache)
        control.put(("ready", os.getpid()))
        tasks.get()
        return result
    inputs = zoo.example_inputs(task["model"], rows, seed=1 + task["index"])
    runner, client = _make_runner(task, cache)
    for _ in range(3):  # warm-up: connections, regions, kernels
        runner(inputs)
    before = _client_stats(client) if client is not None else {}
    control.put(("ready", os.getpid()))
    start_at = tasks.get()
    while time.time() < start_at:
        time.sleep(0.0005)
    end = start_at + task["duration"]
    done = 0
    last = start_at
    latencies = []
    while time.time() < end:
        began = time.perf_counter()
        runner(inputs)
        latencies.append(time.perf_counter() - began)
        done += rows
        last = time.time()
    result = {"rows": done, "elapsed_s": last - start_at,
              "rows_per_s": done / (last - start_at) if done else 0.0,
              "chunk_ms_p50": 1e3 * float(np.median(latencies)) if latencies else None,
              "chunks": len(latencies)}
    if client is not None:
        result["transport"] = getattr(client, "transport_kind", None)
        after = _client_stats(client)
        delta = {name: after[name] - before.get(name, 0) for name in after}
        requests = max(delta["requests"], 1)
        result["client"] = {"requests_per_chunk": round(delta["requests"] / max(len(latencies), 1), 2),
                            "request_latency_ms": round(1e3 * delta["latency_s"] / requests, 3),
                            "retries": delta["retries"], "failed": delta["failed_requests"],
                            "fallback_rows": delta["fallback_rows"]}
        if hasattr(client, "close"):
            client.close()
    return result


# -- probes (coffea_sonic.bench.probes: the harness' GPU sampler and statistics reader) ---------------

def server_stats(grpc_address: str, model: str) -> Any:
    """Triton's cumulative statistics of ``model`` (every version), through the transport layer."""
    from coffea_sonic.bench.probes import server_statistics, statistics_transport

    return server_statistics(statistics_transport(grpc_address), model)


# -- servers ------------------------------------------------------------------------------------------

def start_server(config: Server, models: list[str], device: str, base: Path | None):
    """A started LocalTritonServer for ``config`` (the repository copied from ``base`` when given)."""
    from coffea_sonic.server import LocalTritonServer
    from coffea_sonic.server.repository import config_text, model_config

    if config.default:
        return LocalTritonServer(models=models, device=device, startup_timeout_s=240).start()
    if base is None:
        return LocalTritonServer(models=models, device=device, instances=config.instances,
                                 repository_options=config.options, startup_timeout_s=240).start()
    # same files as LocalTritonServer would write (TorchScript exported once), this config's
    # config.pbtxt: only the instance count and the options differ
    repository = Path(tempfile.mkdtemp(prefix="defaults-repo-"))
    shutil.copytree(base, repository, dirs_exist_ok=True, symlinks=True)
    from coffea_sonic.server.launcher import GPU_INSTANCES

    instances = config.instances or (GPU_INSTANCES if device == "gpu" else 1)
    for name in models:
        text = config_text(model_config(name, backend="python", device=device,
                                        instances=instances, **config.options))
        (repository / name / "config.pbtxt").write_text(text)
    return LocalTritonServer(repository=repository, device=device, startup_timeout_s=240).start()


# -- main ---------------------------------------------------------------------------------------------

def describe_client(run: Run) -> str:
    if run.kind == "verify":
        return "served == in-process check"
    if run.kind == "local":
        return "in-process engine"
    if run.kind == "cuda-host":
        pieces = run.client.get("pieces", 1)
        return ("CudaShmTransport, host inputs, "
                + ("whole chunk" if pieces == 1 else f"{pieces} pieces in flight"))
    if not run.client:
        return "TritonModel()"
    parts = []
    for key, value in run.client.items():
        if key == "max_request_bytes":
            parts.append(f"{value / MiB:g} MiB")
        elif key == "max_in_flight":
            parts.append(f"{value} in flight")
        elif key == "connections":
            parts.append(f"{value} connection{'s' if value > 1 else ''}")
        else:
            parts.append(str(value))
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", default="final", choices=sorted(PLANS))
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds per run (default: final 4, sweep 2; 8+ processes +0.5)")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="start no run after this many seconds (the JSON is written anyway)")
    parser.add_argument("--out", default="bench-output/defaults")
    parser.add_argument("--tag", default=None)
    parser.add_argument("--device", default="gpu", choices=["cpu", "gpu"])
    parser.add_argument("--no-16", action="store_true", help="final plan: leave out 16 processes")
    parser.add_argument("--only", default=None,
                        help="comma list of server-config names (substrings) to run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    began = time.time()
    plan = plan_final(not args.no_16) if args.plan == "final" else PLANS[args.plan]()
    if args.only:
        wanted = args.only.split(",")
        plan = [s for s in plan if s.name.startswith("in-process")
                or any(w in s.name for w in wanted)]
    duration = args.duration or (4.0 if args.plan == "final" else 2.0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or args.plan
    records: list[dict] = []
    report = {"machine": machine_info(), "plan": args.plan, "duration_s": duration, "records": records,
              "chunk_rows": CHUNK_ROWS}
    logger.info("machine: %s", report["machine"])
    models = sorted({run.model for server in plan for run in server.runs})
    # generate/cached zoo models once, before client processes need them
    from coffea_sonic import zoo

    for name in models:
        zoo.onnx_path(name)
    from coffea_sonic.bench.probes import GpuUtilisation

    pool = ClientPool(max(run.procs for server in plan for run in server.runs), _run_task)
    gpu = GpuUtilisation().__enter__()
    base: Path | None = None
    if args.plan != "final" and any(not s.default and s.runs and s.runs[0].kind != "local"
                                    for s in plan):
        from coffea_sonic.server import write_repository

        base = Path(tempfile.mkdtemp(prefix="defaults-base-")) / "models"
        write_repository(base, models, backend="python", device=args.device, instances=1, link=True)
    baseline: dict[str, float] = {}
    stopped = False
    try:
        for config in plan:
            if stopped:
                break
            served = any(run.kind != "local" for run in config.runs)
            server = None
            if served:
                if time.time() - began > args.budget:
                    stopped = True
                    break
                t0 = time.time()
                try:
                    server = start_server(config, models, args.device, base)
                except Exception as error:  # noqa: BLE001 - report it and go on
                    logger.error("%s: server did not start: %s", config.name, error)
                    records.append({"server": config.name, "error": f"server start: {error}"[:3000]})
                    continue
                logger.info("%s: server ready in %.1f s", config.name, time.time() - t0)
            try:
                for run in config.runs:
                    if time.time() - began > args.budget:
                        logger.warning("time budget spent: the remaining runs are left out")
                        stopped = True
                        break
                    record = measure(run, config, server, pool, gpu, duration, args.device)
                    if run.kind == "local":
                        baseline.setdefault(run.model, record.get("rows_per_s") or 0)
                    reference = baseline.get(run.model)
                    if reference and run.kind != "local" and record.get("rows_per_s"):
                        record["ratio"] = round(record["rows_per_s"] / reference, 3)
                    records.append(record)
                    logger.info("%-34s %-30s %-10s procs=%-2d %10s rows/s  ratio=%s  gpu=%s%%  "
                                "server=%s client=%s %s", config.name, describe_client(run),
                                run.model, run.procs, format_rate(record.get("rows_per_s")),
                                record.get("ratio"), record.get("gpu_busy"), record.get("profile"),
                                record.get("client_summary"), record.get("errors") or "")
                    (out / f"defaults-{tag}.json").write_text(json.dumps(report, indent=1))
                    if "died" in " ".join(record.get("errors", [])):
                        pool.close()
                        pool = ClientPool(pool.size, _run_task)
            finally:
                if server is not None:
                    server.stop()
    finally:
        gpu.__exit__(None, None, None)
        pool.close()
    report["baseline_rows_per_s"] = baseline
    report["elapsed_s"] = round(time.time() - began, 1)
    (out / f"defaults-{tag}.json").write_text(json.dumps(report, indent=1))
    table = summary_markdown(report)
    (out / f"defaults-{tag}.md").write_text(table + "\n")
    print(table)
    return 0


def measure(run: Run, config: Server, server, pool: ClientPool, gpu: Any, duration: float,
            device: str) -> dict:
    from coffea_sonic.bench.probes import run_gpu_mean, server_profile

    rows = CHUNK_ROWS[run.model]
    seconds = run.duration or (duration + (0.5 if run.procs >= 8 else 0.0))
    task = {"kind": run.kind, "model": run.model, "rows": rows, "client": run.client,
            "duration": seconds, "device": device,
            "url": server.url(run.model) if server is not None else None,
            "grpc": server.grpc_address if server is not None else None}
    record: dict[str, Any] = {"server": config.name, "instances": config.instances,
                              "server_options": config.options, "default_server": config.default,
                              "kind": run.kind, "client": describe_client(run),
                              "client_options": run.client, "model": run.model, "rows": rows,
                              "procs": run.procs}
    served = server is not None and run.kind != "local"
    before = server_stats(server.grpc_address, run.model) if served else None
    try:
        start_at, results = pool.run(task, run.procs)
    except RuntimeError as error:
        record["errors"] = [str(error)]
        return record
    errors = [r["error"] for r in results if "error" in r]
    good = [r for r in results if "error" not in r]
    record["errors"] = errors
    if run.kind == "verify":
        record["max_abs_diff"] = good[0]["max_abs_diff"] if good else None
        return record
    record["rows_per_s"] = round(sum(r["rows_per_s"] for r in good)) if good else None
    record["per_process"] = [round(r["rows_per_s"]) for r in good]
    transports = sorted({str(r.get("transport")) for r in good if r.get("transport")})
    if transports:  # what TritonModel chose in the client processes
        record["transport"] = "/".join(transports)
        record["client"] += f" [{record['transport']}]"
    record["chunk_ms_p50"] = round(float(np.median([r["chunk_ms_p50"] for r in good
                                                     if r["chunk_ms_p50"]])), 3) if good else None
    record["gpu_busy"] = run_gpu_mean(gpu, start_at, start_at + seconds)
    record["duration_s"] = seconds
    if served:
        record["server_profile"] = server_profile(
            before, server_stats(server.grpc_address, run.model), seconds)
        profile = record["server_profile"]
        record["profile"] = (f"{profile['queue_ms']}/{profile['compute_input_ms']}/"
                            f"{profile['compute_infer_ms']}/{profile['compute_output_ms']} "
                            f"b={profile['avg_batch']}")
    clients = [r["client"] for r in good if "client" in r]
    if clients:
        record["client_profile"] = clients[0]
        record["client_summary"] = (f"{clients[0]['requests_per_chunk']} req/chunk, "
                            f"{clients[0]['request_latency_ms']} ms/req")
    return record


def summary_markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"card: {m.get('gpu', 'none')}; {m.get('cores')} cores ({m.get('cpu', '?')}); "
             f"date {m.get('date')}; plan {report['plan']}; {report['duration_s']} s per run; "
             f"chunks: emtrk_cnn {CHUNK_ROWS['emtrk_cnn']} rows, jet_tagger {CHUNK_ROWS['jet_tagger']}",
             "",
             "| server | client | model | procs | rows/s | in-process | ratio | GPU % | chunk ms | "
             "server queue/in/infer/out ms, avg batch |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    base = report.get("baseline_rows_per_s") or {}
    for r in report["records"]:
        if r.get("kind") == "verify":
            diff = r.get("max_abs_diff")
            lines.append(f"| {r['server']} | served vs in-process, max abs diff | {r['model']} | 1 | "
                         f"{'ERROR ' + '; '.join(r.get('errors') or []) if diff is None else f'{diff:.2e}'}"
                         f" |  |  |  |  |  |")
            continue
        if r.get("rows_per_s") is None:
            errors = "; ".join(r.get("errors") or [r.get("error", "")])[:300]
            lines.append(f"| {r.get('server')} | {r.get('client', '')} | {r.get('model', '')} | "
                         f"{r.get('procs', '')} | ERROR {errors} |")
            continue
        lines.append(
            f"| {r['server']} | {r['client']} | {r['model']} | {r['procs']} | "
            f"{format_rate(r['rows_per_s'])} | {format_rate(base.get(r['model']))} | "
            f"{r.get('ratio', '–')} | {r.get('gpu_busy') if r.get('gpu_busy') is not None else '–'} | "
            f"{r.get('chunk_ms_p50')} | {r.get('profile', '–')} |")
    if report["plan"] == "final":
        lines += ["", "targets: emtrk_cnn 1 process >= 0.7x, 8 processes >= 0.9x with GPU "
                  ">= 80 %; jet_tagger 8 processes >= 1x"]
        for r in report["records"]:
            if r.get("default_server") and r.get("ratio") is not None:
                goal = {("emtrk_cnn", 1): 0.7, ("emtrk_cnn", 8): 0.9,
                        ("jet_tagger", 8): 1.0}.get((r["model"], r["procs"]))
                if goal is None:
                    continue
                busy_goal = r["model"] == "emtrk_cnn" and r["procs"] == 8
                met = r["ratio"] >= goal and (not busy_goal or (r.get("gpu_busy") or 0) >= 80)
                busy = f", GPU {r.get('gpu_busy')} % (goal 80)" if busy_goal else ""
                lines.append(f"- {r['model']} x {r['procs']}: {r['ratio']}x (goal {goal}x{busy}): "
                             f"{'met' if met else 'NOT met'}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
