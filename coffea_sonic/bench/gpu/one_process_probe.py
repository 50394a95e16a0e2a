"""Where one client process' time goes with a GPU model: in-process pieces against served ones.

For ``emtrk_cnn`` chunks of 2048 rows (18.9 MB) on one GPU, median milliseconds of:

* in process: ``GpuEngine`` (host arrays in and out), its parts (host -> GPU copies three ways,
  the eager module on GPU inputs, the TorchScript file the server loads, unoptimised and
  optimised), and the output's copy back;
* served by a default ``LocalTritonServer(device="gpu")``: the CUDA-memory transport with the
  inputs already on the GPU (no client copy: server, gRPC and the python backend alone), with host
  inputs (``copy_host_to_device``), and the default ``TritonModel``; the bare gRPC call of one
  prepared request on the same region (grpc-python and the server alone) and tritonclient's
  client making it; beside each served row, the server's own milliseconds per request (queue,
  compute input, infer and output); then the same against a server started with
  ``--cuda-memory-pool-byte-size=0:1073741824`` (Triton's pool that hands GPU tensors to
  python-backend processes; default 64 MiB);
* CUDA IPC: opening and closing an 18.9 MB region's handle in another process, what the python
  backend's model process does for every request whose input lies in a client's CUDA memory.

Run on a GPU machine after ``source benchmarks/gpu/triton-gpu-env.sh .device``::

    python3 -m coffea_sonic.bench.gpu.one_process_probe --out $OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


MODEL, ROWS = "emtrk_cnn", 2048


def timed(function: Callable[[], Any], repeats: int = 40, warm: int = 5) -> float:
    """Median wall milliseconds of ``function()`` (which must synchronise what it starts).

    >>> timed(lambda: None, repeats=3, warm=1) >= 0
    True
    """
    for _ in range(warm):
        function()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(1e3 * (time.perf_counter() - start))
    return round(statistics.median(samples), 3)


def in_process(results: dict[str, float]) -> None:
    import torch

    from coffea_sonic import zoo
    from coffea_sonic.engines import GpuEngine
    from coffea_sonic.server.repository import _export_torchscript
    from coffea_sonic.transport.shm.cuda import copy_host_to_device

    inputs = zoo.example_inputs(MODEL, ROWS, seed=1)
    (name, host), = inputs.items()
    engine = GpuEngine(MODEL)
    results["GpuEngine call (host in, host out)"] = timed(lambda: engine(inputs))
    device = torch.device("cuda:0")
    on_gpu = torch.from_numpy(host).to(device)
    target = torch.empty(host.nbytes, dtype=torch.uint8, device=device)
    sync = torch.cuda.synchronize

    def pageable():
        target.copy_(torch.from_numpy(host.reshape(-1).view(np.uint8)))
        sync()

    def pin_then_copy():
        torch.from_numpy(host).pin_memory().to(device, non_blocking=True)
        sync()

    def staged():
        copy_host_to_device(host, target)
        sync()

    results["H2D pageable copy_"] = timed(pageable)
    results["H2D pin_memory() + to (GpuEngine's)"] = timed(pin_then_copy)
    results["H2D staged, 4 threads (CUDA transport's)"] = timed(staged)
    module = engine.module
    with torch.inference_mode():
        results["eager module, GPU input"] = timed(lambda: (module(on_gpu), sync()))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.pt"
            _export_torchscript(MODEL, path)
            scripted = torch.jit.load(str(path), map_location=device).eval()
        for optimize in (False, True):
            with torch.jit.optimized_execution(optimize):
                results[f"TorchScript (server's file), optimized_execution={optimize}"] = timed(
                    lambda: (scripted(on_gpu), sync()))
        output = module(on_gpu)
        output = output[0] if isinstance(output, (tuple, list)) else output
        results["D2H output"] = timed(lambda: output.cpu())


def served(results: dict[str, float], label: str, extra_args: list[str]) -> None:
    import torch

    from coffea_sonic import TritonModel, zoo
    from coffea_sonic.bench.probes import (server_statistics, server_statistics_summary,
                                           statistics_transport)
    from coffea_sonic.routing import clear_routers
    from coffea_sonic.server import LocalTritonServer
    from coffea_sonic.transport.base import InferRequest
    from coffea_sonic.transport.shm import CudaShmTransport

    inputs = zoo.example_inputs(MODEL, ROWS, seed=1)
    outputs = zoo.declared_info(MODEL).outputs
    on_gpu = {key: torch.from_numpy(value).cuda() for key, value in inputs.items()}
    with LocalTritonServer(models=[MODEL], device="gpu", extra_args=extra_args) as server:
        statistics = statistics_transport(server.grpc_address)

        def served_row(name: str, function: Callable[[], Any]) -> None:
            before = server_statistics(statistics, MODEL)
            results[f"{label}: {name}"] = timed(function)
            summary = server_statistics_summary(server_statistics(statistics, MODEL) - before, 0.0)
            results[f"{label}: {name}, server ms per request"] = round(sum(
                summary[f"{part}_ms_per_request"]
                for part in ("queue", "compute_input", "compute_infer", "compute_output")), 3)

        with CudaShmTransport(server.grpc_address) as cuda:
            served_row("CUDA transport, inputs already on the GPU",
                       lambda: cuda.infer_tensors(MODEL, "", on_gpu, outputs))
            served_row("CUDA transport, host inputs",
                       lambda: cuda.infer(InferRequest(MODEL, "", inputs, outputs, rows=ROWS)))
            for name, function in _bare_calls(cuda, server.grpc_address, on_gpu, outputs):
                served_row(name, function)
        clear_routers()
        model = TritonModel(server.url(MODEL))
        served_row(f"TritonModel() [{model.transport_kind}]", lambda: model(inputs))
        model.close()


def _bare_calls(cuda: Any, address: str, on_gpu: dict, outputs: Any):
    """``(name, call)`` of one request prepared once in a slot of ``cuda``: the bare gRPC call
    and tritonclient's client on the same region."""
    import tritonclient.grpc as tritonclient

    from coffea_sonic.transport.base import InferRequest
    from coffea_sonic.transport.shm.common import plan

    request = InferRequest(MODEL, "", on_gpu, tuple(outputs), rows=ROWS)
    layout = plan(request, every_output=True)
    slot = cuda.pool.acquire(layout.total, 30)
    message = cuda._message(request, slot, layout)
    stub = cuda.grpc.connection.stub
    client = tritonclient.InferenceServerClient(address)
    tensors = []
    for name, value in on_gpu.items():
        tensor = tritonclient.InferInput(name, list(value.shape), "FP32")
        offset, nbytes = layout.inputs[name]
        tensor.set_shared_memory(slot.name, nbytes, offset=offset)
        tensors.append(tensor)
    wanted = []
    for output in outputs:
        requested = tritonclient.InferRequestedOutput(output.name)
        offset, nbytes = layout.outputs[output.name]
        requested.set_shared_memory(slot.name, nbytes, offset=offset)
        wanted.append(requested)
    return [("bare gRPC call of one prepared request", lambda: stub.ModelInfer(message)),
            ("tritonclient InferenceServerClient.infer, same region",
             lambda: client.infer(MODEL, tensors, outputs=wanted))]


def _ipc_importer(connection: Any) -> None:
    import ctypes

    driver = ctypes.CDLL("libcuda.so.1")
    context = ctypes.c_void_p()
    driver.cuInit(0)
    driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0)
    driver.cuCtxSetCurrent(context)

    class Handle(ctypes.Structure):
        _fields_ = [("reserved", ctypes.c_char * 64)]

    handle = Handle()
    ctypes.memmove(ctypes.addressof(handle), connection.recv(), 64)
    opens, closes = [], []
    for _ in range(60):
        pointer = ctypes.c_uint64()
        began = time.perf_counter()
        driver.cuIpcOpenMemHandle_v2(ctypes.byref(pointer), handle, 1)
        opened = time.perf_counter()
        driver.cuIpcCloseMemHandle(pointer)
        opens.append(1e3 * (opened - began))
        closes.append(1e3 * (time.perf_counter() - opened))
    connection.send((statistics.median(opens), statistics.median(closes)))


def ipc_handles(results: dict[str, float]) -> None:
    import multiprocessing

    from coffea_sonic.transport.shm.cuda import CudaRegion

    region = CudaRegion(18_874_368, 0)
    ours, theirs = multiprocessing.Pipe()
    child = multiprocessing.get_context("spawn").Process(target=_ipc_importer, args=(theirs,))
    child.start()
    ours.send(region.handle)
    opened, closed = ours.recv()
    child.join()
    region.close()
    results["CUDA IPC: open an 18.9 MB region's handle in another process"] = round(opened, 4)
    results["CUDA IPC: close it"] = round(closed, 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    results: dict[str, float] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    steps = [lambda: in_process(results), lambda: ipc_handles(results),
             lambda: served(results, "default server", []),
             lambda: served(results, "pool 1 GiB", ["--cuda-memory-pool-byte-size=0:1073741824"])]
    for step in steps:
        shown = len(results)
        step()
        for key, value in list(results.items())[shown:]:
            print(f"{value:8.3f} ms  {key}", flush=True)
        (args.out / "one_process_probe.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
