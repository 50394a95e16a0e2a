"""Honest GPU-vs-CPU differences of every zoo model, as shadow validation measures them.

Serves the zoo models with ``LocalTritonServer(device=DEVICE)`` (the default GPU server: the
TorchScript export on CUDA, TF32 off) and sends each model ``--rows`` rows of
``zoo.example_inputs`` (several seeds, so several batches and cuDNN algorithm picks) with a
default ``TritonModel``; compares the answers with the in-process reference engine that shadow
validation runs (``CpuEngine``: onnxruntime on the CPU, the same ONNX file the export came from).
Per model and output: max |served - reference|, max relative difference (where |reference| > 1e-6)
and shadow's own measure ``divergence`` (|served - reference| / max(1, |reference|)). A second
pass goes through shadow validation itself (``shadow=1.0``, tolerance 1.0): the hook's report
must show the same largest divergence.

Writes ``--out`` (JSON) and prints a table. On the CPU box ``--device cpu`` checks the script
(served on the CPU: 0 expected).

    python benchmarks/gpu/shadow_tolerance.py --device gpu --out $OUT/shadow_tolerance.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from coffea_sonic import zoo
from coffea_sonic.engines import CpuEngine
from coffea_sonic.model import TritonModel
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.shadow import divergence, shadow_hook

#: rows per model: the CNN's 48x48 patches cost the CPU reference most
ROWS = {"emtrk_cnn": 2048}


def differences(served: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """Max absolute, max relative (|reference| > 1e-6) and shadow's divergence."""
    served = np.asarray(served, np.float64)
    reference = np.asarray(reference, np.float64).reshape(served.shape)
    gap = np.abs(served - reference)
    large = np.abs(reference) > 1e-6
    relative = float(np.max(gap[large] / np.abs(reference[large]))) if large.any() else 0.0
    return {"max_abs": float(gap.max(initial=0.0)), "max_rel": relative,
            "divergence": divergence(served, reference),
            "reference_max_abs": float(np.abs(reference).max(initial=0.0))}


def merge(total: dict[str, float], found: dict[str, float]) -> dict[str, float]:
    return {key: max(total.get(key, 0.0), value) for key, value in found.items()}


def measure(server: LocalTritonServer, name: str, rows: int, seeds: int) -> dict:
    """One model: every seed's rows served and recomputed; the largest differences per output."""
    reference = CpuEngine(name)
    model = TritonModel(server.url(name), fallback="off", timeout_s=120)
    outputs: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    try:
        for seed in range(seeds):
            inputs = zoo.example_inputs(name, rows, seed=100 + seed)
            served, expected = model(inputs), reference(inputs)
            for output, value in served.items():
                outputs[output] = merge(outputs.get(output, {}), differences(value,
                                                                             expected[output]))
        gpu = bool(model.info.gpu)
    finally:
        model.close()
    return {"rows": rows * seeds, "served_on_gpu": gpu, "outputs": outputs,
            "seconds": time.perf_counter() - started,
            "through_shadow": through_shadow(server, name, min(rows, 512))}


def through_shadow(server: LocalTritonServer, name: str, rows: int) -> dict:
    """The same comparison through shadow validation (every row shadowed, nothing alarms)."""
    model = TritonModel(server.url(name), fallback="off", timeout_s=120, shadow=1.0,
                        shadow_tolerance=1.0)
    try:
        model(zoo.example_inputs(name, rows, seed=7))
        hook = shadow_hook(model)
        assert hook is not None
        hook.drain()
        return hook.report()
    finally:
        model.close()


def machine(device: str) -> dict:
    found = {"device": device, "python": platform.python_version(), "cores": _cores(),
             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        import torch

        if torch.cuda.is_available():
            found["gpu"] = torch.cuda.get_device_name(0)
        found["torch"] = torch.__version__
    except ImportError:
        pass
    import onnxruntime

    found["onnxruntime"] = onnxruntime.__version__
    return found


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


def table(results: dict) -> str:
    lines = [f"{'model':18} {'output':14} {'rows':>6} {'max_abs':>10} {'max_rel':>10} "
             f"{'divergence':>10} {'|ref| max':>10} {'shadow':>10}"]
    for name, found in results.items():
        if "error" in found:
            lines.append(f"{name:18} error: {found['error']}")
            continue
        shadowed = {output: entry["largest"] for server in found["through_shadow"].values()
                    for output, entry in server.items()}
        for output, entry in found["outputs"].items():
            lines.append(f"{name:18} {output:14} {found['rows']:>6} {entry['max_abs']:10.3g} "
                         f"{entry['max_rel']:10.3g} {entry['divergence']:10.3g} "
                         f"{entry['reference_max_abs']:10.3g} {shadowed.get(output, -1):10.3g}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="gpu", choices=("cpu", "gpu"))
    parser.add_argument("--models", nargs="+", default=zoo.names(), choices=zoo.names())
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default="shadow_tolerance.json")
    args = parser.parse_args()
    summary: dict = {"machine": machine(args.device), "command": " ".join(sys.argv),
                     "models": {}}
    started = time.perf_counter()
    with LocalTritonServer(models=args.models, device=args.device).start() as server:
        summary["server_ready_s"] = time.perf_counter() - started
        for name in args.models:
            try:
                summary["models"][name] = measure(server, name, ROWS.get(name, args.rows),
                                                  args.seeds)
            except Exception as error:  # noqa: BLE001 - one model's failure is reported, not fatal
                summary["models"][name] = {"error": f"{type(error).__name__}: {error}"}
            Path(args.out).write_text(json.dumps(summary, indent=1))
    summary["seconds"] = time.perf_counter() - started
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(table(summary["models"]))
    print(json.dumps(summary["machine"]), f"{summary['seconds']:.1f} s")
    return 0 if all("error" not in found for found in summary["models"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
