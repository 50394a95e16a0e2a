"""Honest divergence of a GPU server from the in-process CPU reference, per zoo model and output:
what shadow validation's default GPU tolerance (``coffea_sonic.shadow.DEFAULT_TOLERANCE``) must
stay above, and what an altered model (weights x 1.01, fp16) must stay below.

Serves every zoo model on the GPU (``LocalTritonServer(device=DEVICE)``, the default config),
sends ``--rows`` rows of each through a default ``TritonModel``, and compares with the CPU engine
(onnxruntime: the reference shadow validation uses) by :func:`coffea_sonic.shadow.divergence`.

    python -m coffea_sonic.bench.gpu.shadow_tolerance --device gpu --rows 20000 \
        --out $OUT/shadow_tolerance.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

from coffea_sonic import zoo
from coffea_sonic.engines import CpuEngine
from coffea_sonic.model import TritonModel
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.shadow import DEFAULT_TOLERANCE, divergence


def measure(device: str, rows: int, models: list[str]) -> dict:
    found: dict = {}
    with LocalTritonServer(models=models, device=device) as server:
        for name in models:
            count = min(rows, 2000) if name.startswith(("particlenet", "emtrk")) else rows
            inputs = zoo.example_inputs(name, count, seed=17)
            model = TritonModel(server.url(name), fallback="off")
            try:
                served = model(inputs)
                transport = model.transport_kind
            finally:
                model.close()
            reference = CpuEngine(name)(inputs)
            found[name] = {"rows": count, "transport": transport, "outputs": {
                output: {"divergence": divergence(served[output], reference[output]),
                         "max_abs": float(np.max(np.abs(served[output] - reference[output])))}
                for output in reference}}
            print(name, json.dumps(found[name]), flush=True)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="gpu", choices=["cpu", "gpu"])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--models", nargs="+", default=None,
                        help="zoo models (default: every one that is not a pipeline)")
    parser.add_argument("--out", default="shadow_tolerance.json")
    args = parser.parse_args(argv)
    models = args.models or [n for n in zoo.names() if n not in zoo.pipeline_names()]
    started = time.time()
    results = measure(args.device, args.rows, models)
    worst = max(o["divergence"] for r in results.values() for o in r["outputs"].values())
    summary = {"device": args.device, "host": platform.node(), "date": time.strftime("%Y-%m-%d"),
               "default_tolerance": DEFAULT_TOLERANCE, "worst_divergence": worst,
               "seconds": round(time.time() - started, 1), "models": results}
    with open(args.out, "w") as handle:
        json.dump(summary, handle, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "models"}))
    return 0


if __name__ == "__main__":
    main()
