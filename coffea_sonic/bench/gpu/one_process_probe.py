"""Where one client process' time goes with a GPU model: in-process pieces against served ones.

For ``emtrk_cnn`` chunks of 2048 rows (18.9 MB) on one GPU, median milliseconds of:

* in process: ``GpuEngine`` (host arrays in and out), its parts (host -> GPU copies three ways,
  the eager module on GPU inputs, the TorchScript file the server loads, unoptimised and
  optimised), and the output's copy back;
* served by a default ``LocalTritonServer(device="gpu")``: the CUDA-memory transport with the
  inputs already on the GPU (no client copy: server, gRPC and the python backend alone), with host
  inputs (``copy_host_to_device``), and the default ``TritonModel``; then the same against a server
  started with ``--cuda-memory-pool-byte-size=0:1073741824`` (Triton's pool that hands GPU
  tensors to python-backend processes; default 64 MiB).

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
    from coffea_sonic.routing import clear_routers
    from coffea_sonic.server import LocalTritonServer
    from coffea_sonic.transport.base import InferRequest
    from coffea_sonic.transport.shm import CudaShmTransport

    inputs = zoo.example_inputs(MODEL, ROWS, seed=1)
    outputs = zoo.declared_info(MODEL).outputs
    on_gpu = {key: torch.from_numpy(value).cuda() for key, value in inputs.items()}
    with LocalTritonServer(models=[MODEL], device="gpu", extra_args=extra_args) as server:
        with CudaShmTransport(server.grpc_address) as cuda:
            results[f"{label}: CUDA transport, inputs already on the GPU"] = timed(
                lambda: cuda.infer_tensors(MODEL, "", on_gpu, outputs))
            results[f"{label}: CUDA transport, host inputs"] = timed(
                lambda: cuda.infer(InferRequest(MODEL, "", inputs, outputs, rows=ROWS)))
        clear_routers()
        model = TritonModel(server.url(MODEL))
        results[f"{label}: TritonModel() [{model.transport_kind}]"] = timed(lambda: model(inputs))
        model.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    results: dict[str, float] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    steps = [lambda: in_process(results), lambda: served(results, "default server", []),
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
