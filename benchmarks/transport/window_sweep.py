"""Request size x requests in flight for one default-otherwise TritonModel, per transport, one run.

One client process (:func:`coffea_sonic.bench.reference.tritonmodel_task`) calls the transport-bound
``passthrough`` model (x: 16 floats -> y: 2, 200 000-row calls, 12.8 MB) on an embedded server back
to back; every configuration gets one window per round, the rounds alternate through all
configurations (so a machine others load shifts all of them alike), and the table keeps each
configuration's best and median window. Writes window-sweep.json and window-sweep.md.

    python benchmarks/transport/window_sweep.py --transports grpc http --out benchmarks/results/cpu2-window
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from coffea_sonic.bench.clients import ClientPool
from coffea_sonic.bench.machine import machine_info
from coffea_sonic.bench.reference_run import uptime_line
from coffea_sonic.bench.passthrough import PASSTHROUGH, write_passthrough
from coffea_sonic.bench.reference import tritonmodel_task
from coffea_sonic.server import LocalTritonServer

MiB = 1 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transports", nargs="+", default=["grpc"])
    parser.add_argument("--sizes-mib", nargs="+", type=float, default=[1, 2, 4, 8])
    parser.add_argument("--in-flight", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench-output/window-sweep")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine_info(), "uptime_before": uptime_line(), "rows": args.rows,
              "window_s": args.window, "command": " ".join(sys.argv), "windows": {}}
    configs = [(t, s, f) for t in args.transports for s in args.sizes_mib for f in args.in_flight]
    repository = write_passthrough(Path(tempfile.mkdtemp(prefix="passthrough-")))
    pool = ClientPool(1, tritonmodel_task)
    try:
        with LocalTritonServer(repository=repository, device="cpu") as server:
            for _ in range(args.rounds):
                for transport, size, flight in configs:
                    address = server.http_address if transport == "http" else server.grpc_address
                    scheme = "http" if transport == "http" else "grpc"
                    task = {"url": f"triton+{scheme}://{address}/{PASSTHROUGH}",
                            "transport": transport, "rows": args.rows, "model": PASSTHROUGH,
                            "duration": args.window,
                            "options": {"max_request_bytes": int(size * MiB),
                                        "max_in_flight": flight}}
                    _, (result,) = pool.run(task, 1)
                    key = f"{transport} {size:g} MiB x {flight}"
                    report["windows"].setdefault(key, []).append(result.get("rows_per_s", 0.0))
                    print(key, result, flush=True)
    finally:
        pool.close()
    report["uptime_after"] = uptime_line()
    (out / "window-sweep.json").write_text(json.dumps(report, indent=1, default=str))
    lines = [f"# {PASSTHROUGH}, {args.rows}-row calls, one process ({report['machine']['cpu_model']}, "
             f"{report['machine']['cpu_cores']} cores, {report['machine']['date']})", "",
             f"load: before `{report['uptime_before']}`, after `{report['uptime_after']}`", "",
             f"command: `{report['command']}`", "",
             "| transport, request size x in flight | best M rows/s | median M rows/s |",
             "|---|---|---|"]
    for key, windows in report["windows"].items():
        lines.append(f"| {key} | {max(windows) / 1e6:.2f} | {statistics.median(windows) / 1e6:.2f} |")
    (out / "window-sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
