"""Check ``coffea-sonic serve --device gpu`` end to end and compare the engines on one model.

1. Starts the real CLI (``coffea-sonic -v serve --device DEVICE --models MODEL``) on free ports,
   waits for its "ready" line, sends one request with TritonModel, compares the answer with
   in-process onnxruntime, and keeps the server-log lines that show where the model instance runs
   (``TRITONBACKEND_ModelInstanceInitialize: ... (GPU device 0)``); then stops it with SIGTERM.
2. Times CpuEngine and (where a GPU exists) GpuEngine on the same rows: rows/s and max |Δ|.

Writes a JSON summary (``--out``) and prints it. Runs on the CPU box too (``--device cpu``).

    python -m coffea_sonic.bench.gpu.serve_check --device gpu --model emtrk_cnn \
        --out $OUT/serve_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from coffea_sonic import zoo
from coffea_sonic.bench.client import max_abs_difference
from coffea_sonic.engines import CpuEngine
from coffea_sonic.model import TritonModel

READY = re.compile(r"server ready in ([0-9.]+) s \(device (\w+), pid (\d+)\)")
GRPC = re.compile(r"gRPC\s+(\S+)")
REPOSITORY = re.compile(r"--model-repository=(\S+)")


def check_serve(device: str, model: str, rows: int, timeout_s: float) -> dict:
    command = [sys.executable, "-m", "coffea_sonic.cli", "-v", "serve", "--device", device,
               "--models", model, "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    lines: list[str] = []
    found: dict[str, str] = {}
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip())
            for key, pattern in (("ready", READY), ("grpc", GRPC), ("repository", REPOSITORY)):
                match = pattern.search(line)
                if match and key not in found:
                    found[key] = match.group(1) if key != "ready" else match.group(0)
            if "ready" in found and "grpc" in found:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = time.perf_counter()
    result: dict = {"command": " ".join(command[1:])}
    try:
        if not ready.wait(timeout_s):
            result["error"] = "no ready line in time"
            return result
        result["ready_after_s"] = time.perf_counter() - started
        result["ready_line"] = found["ready"]
        inputs = zoo.example_inputs(model, rows, seed=3)
        served = TritonModel(f"triton+grpc://{found['grpc']}/{model}", timeout_s=120)(inputs)
        result["served_vs_cpu_max_abs_diff"] = max_abs_difference(served, CpuEngine(model)(inputs))
        log = Path(found.get("repository", "/nonexistent")).parent / "tritonserver.log"
        if log.exists():
            result["instance_log"] = [line.strip() for line in log.read_text(errors="replace")
                                      .splitlines() if "ModelInstanceInitialize" in line
                                      or "GPU device" in line][:10]
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        reader.join(timeout=5)
        result["exit_code"] = process.returncode
        result["cli_output"] = [line for line in lines if "ready" in line or "gRPC" in line
                                or "model " in line or "stopped" in line][:12]
    return result


def _rate(engine, inputs: dict, repetitions: int) -> tuple[float, dict]:
    outputs = engine(inputs)  # warm-up (CUDA context, cuDNN autotuning, allocator)
    rows = len(next(iter(inputs.values())))
    times = []
    for _ in range(repetitions):
        started = time.perf_counter()
        outputs = engine(inputs)
        times.append(time.perf_counter() - started)
    return rows / float(np.median(times)), outputs


def compare_engines(model: str, rows: int, repetitions: int) -> dict:
    inputs = zoo.example_inputs(model, rows, seed=4)
    cpu_rate, cpu_outputs = _rate(CpuEngine(model), inputs, repetitions)
    result: dict = {"model": model, "rows": rows, "cpu_engine_rows_per_s": cpu_rate}
    try:
        from coffea_sonic.engines import GpuEngine

        engine = GpuEngine(model)
    except Exception as error:  # noqa: BLE001 - no GPU here: say so in the summary
        result["gpu_engine"] = f"unavailable: {error}"
        return result
    import torch

    gpu_rate, gpu_outputs = _rate(engine, inputs, repetitions)
    result.update(gpu_engine_rows_per_s=gpu_rate, gpu_name=torch.cuda.get_device_name(0),
                  gpu_vs_cpu_max_abs_diff=max_abs_difference(gpu_outputs, cpu_outputs),
                  cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
                  matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="gpu", choices=("cpu", "gpu", "auto"))
    parser.add_argument("--model", default="emtrk_cnn", choices=zoo.names())
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", default="serve_check.json")
    args = parser.parse_args(argv)
    summary = {"serve": check_serve(args.device, args.model, min(args.rows, 256), args.timeout),
               "engines": compare_engines(args.model, args.rows, args.repetitions)}
    Path(args.out).write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary, indent=1, default=str))
    return 0 if "error" not in summary["serve"] else 1


if __name__ == "__main__":
    sys.exit(main())
