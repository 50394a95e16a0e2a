"""Check on a GPU machine, step by step with timings (prints as it goes).

    python -m coffea_sonic.bench.gpu.final_check [--instances N]

1. LocalTritonServer(device="gpu") serving emtrk_cnn: start-up time and the log lines that show
   the model instances on the GPU;
2. served outputs (TritonModel, transport auto and grpc) vs CpuEngine;
3. GpuEngine vs CpuEngine: max |diff| and rows/s on 2048 patches.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from coffea_sonic import TritonModel, zoo
from coffea_sonic.engines import CpuEngine, GpuEngine
from coffea_sonic.server import LocalTritonServer


def rate(function, inputs, repeats=5) -> float:
    """Rows per second of ``function(inputs)``, mean over ``repeats`` calls after one warm-up.

    >>> rate(lambda inputs: None, {"x": [0.0] * 100}, repeats=2) > 0
    True
    """
    function(inputs)
    started = time.perf_counter()
    for _ in range(repeats):
        function(inputs)
    return repeats * len(next(iter(inputs.values()))) / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=None)
    parser.add_argument("--rows", type=int, default=2048)
    args = parser.parse_args(argv)
    inputs = zoo.example_inputs("emtrk_cnn", args.rows, seed=1)
    started = time.perf_counter()
    cpu = CpuEngine("emtrk_cnn")
    reference = cpu(inputs)
    print(f"CpuEngine ready+run {time.perf_counter() - started:.1f} s", flush=True)
    started = time.perf_counter()
    server = LocalTritonServer(models=["emtrk_cnn"], device="gpu", instances=args.instances,
                               startup_timeout_s=240, keep_workdir=True)
    try:
        server.start()
        print(f"serve --device gpu ready in {time.perf_counter() - started:.1f} s "
              f"({server.device})", flush=True)
        for line in open(server.log_path, errors="replace"):
            if "ModelInstanceInitialize" in line or "GPU device" in line:
                print("  log:", line.strip()[-140:], flush=True)
        for transport in ("auto", "grpc"):
            model = TritonModel(server.url("emtrk_cnn"), transport=transport, timeout_s=120)
            served = model(inputs)
            diff = max(float(np.abs(served[k] - reference[k]).max()) for k in reference)
            print(f"served ({transport}) vs CpuEngine: max|diff| {diff:.2e}; "
                  f"{rate(model, inputs):,.0f} rows/s one process", flush=True)
    finally:
        print("server log tail:\n" + server.log_tail(8), flush=True)
        server.stop()
    gpu = GpuEngine("emtrk_cnn")
    local = gpu(inputs)
    diff = max(float(np.abs(local[k] - reference[k]).max()) for k in reference)
    print(f"GpuEngine vs CpuEngine: max|diff| {diff:.2e}; GpuEngine {rate(gpu, inputs):,.0f} rows/s, "
          f"CpuEngine {rate(cpu, inputs, 2):,.0f} rows/s", flush=True)
    return 0


if __name__ == "__main__":
    main()
