"""The plans of :mod:`coffea_sonic.bench.gpu.defaults_sweep`: which server configurations it
starts and which client runs it measures against each (see that module for what each plan asks).

>>> [server.name for server in plan_smoke()]
['in-process', 'defaults', '2 instances, queue delay 0']
>>> _t("emtrk_cnn", 8, 4.5, 2, "grpc").client
{'max_request_bytes': 4718592, 'max_in_flight': 2, 'transport': 'grpc'}
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

MiB = 1 << 20
#: Rows per chunk, per model (the workloads the defaults were chosen for).
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
    # beside the defaults: system shared memory for GPU models too (what auto chooses where the
    # client has no CUDA)
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


def plan_share() -> list[Server]:
    """gRPC forced, at its defaults (requests sized by the process's share of the server's work:
    coffea_sonic.sizing) beside the fixed shared shape (9 MiB x 2), from 1 and from 8 processes;
    the default client (CUDA memory) from 1."""
    grpc = _grpc
    return [Server("in-process", runs=[Run("local", "emtrk_cnn")]),
            Server("defaults", default=True, runs=[
                Run("verify", "emtrk_cnn"), Run("triton", "emtrk_cnn", 1),
                grpc(1), grpc(1, 9, 2), grpc(8), grpc(8, 9, 2), grpc(1)]),
            Server("in-process again", runs=[Run("local", "emtrk_cnn")])]


PLANS = {"accept": plan_accept, "share": plan_share, "final": plan_final, "wire": plan_wire, "wire2": plan_wire2,
         "one": plan_one, "gpus": plan_gpus, "sweep": plan_sweep, "sweep2": plan_sweep2,
         "cuda": plan_cuda, "smoke": plan_smoke}
