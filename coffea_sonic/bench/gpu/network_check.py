"""The e2e analysis with its server on a "GPU host" behind a shaped link vs on the workers' host.

Run by benchmarks/gpu/network_check.sh, or ``python -m coffea_sonic.bench.gpu.network_check``
(root; on the GPU machines pyroute2 does the netlink work,
as they have no ``ip``/``tc``). Two served runs of the same analysis, same files, same workers:

* ``same-host``: LocalTritonServer in this network namespace, the default URL (``auto`` picks
  shared memory, as a worker beside its server gets);
* ``gpu-host``: the same server in a lab host (its own network namespace and /dev/shm) behind a
  veth shaped by tbf to ``--rate-mbit`` both ways, so the workers send over gRPC across the link.

Histograms must be equal; prints a table and writes ``network_check.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path


def _link_bytes(device: str) -> int:
    base = Path("/sys/class/net") / device / "statistics"
    return sum(int((base / name).read_text()) for name in ("rx_bytes", "tx_bytes"))


def _served(url_address: str, fileset, warmup, workers, chunksize, measure) -> dict:
    from coffea_sonic.bench.e2e import _run_once
    from coffea_sonic.examples.jet_tagging import JetTaggingProcessor

    analysis = JetTaggingProcessor(f"triton+grpc://{url_address}", physics=True)
    return _run_once(analysis, fileset, warmup, workers, chunksize, measure)


def _measure(address: str):
    from coffea_sonic.bench.e2e import E2E_MODELS
    from coffea_sonic.bench.probes import server_statistics, statistics_transport

    transport = statistics_transport(address)
    return lambda: {name: server_statistics(transport, name) for name in E2E_MODELS}


def run(options: argparse.Namespace) -> dict:
    from coffea_sonic.bench.e2e import E2E_MODELS, _quiet_dask, write_sample_parallel
    from coffea_sonic.netlab import Lab, Link
    from coffea_sonic.netlab.netlink import netlink
    from coffea_sonic.netlab.services import start_triton
    from coffea_sonic.server import LocalTritonServer

    _quiet_dask()
    directory = tempfile.mkdtemp(prefix="network-check-")
    events, workers = options.events, options.workers
    chunksize = max(1000, min(20_000, events // (4 * workers)))
    files = max(1, min(16, os.cpu_count() or 1, workers))
    rows: dict[str, dict] = {}
    try:
        started = time.perf_counter()
        fileset = write_sample_parallel(directory + "/sample", events, files)
        warmup = write_sample_parallel(directory + "/warmup", chunksize * workers, files, seed=1)
        print(f"wrote {events} events in {time.perf_counter() - started:.0f} s; chunks of "
              f"{chunksize}, {workers} workers, netlink backend {netlink().name}", flush=True)
        with LocalTritonServer(models=E2E_MODELS, device=options.device,
                               startup_timeout_s=300.0) as server:
            rows["same-host"] = _served(server.grpc_address, fileset, warmup, workers, chunksize,
                                        _measure(server.grpc_address))
        print(f"same-host: {rows['same-host']['events_per_s']:.0f} events/s", flush=True)
        with Lab() as lab:
            gpu = lab.host("gpuhost", Link(rate_mbit=options.rate_mbit))
            triton = start_triton(gpu, E2E_MODELS, device=options.device, startup_timeout_s=300.0)
            device = f"csnl{lab.index}r"
            before = _link_bytes(device)
            row = _served(triton.grpc_address, fileset, warmup, workers, chunksize,
                          _measure(triton.grpc_address))
            row["link_bytes_incl_warmup"] = _link_bytes(device) - before
            rows["gpu-host"] = row
        print(f"gpu-host: {rows['gpu-host']['events_per_s']:.0f} events/s", flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    same, far = rows["same-host"], rows["gpu-host"]
    return {"events": events, "workers": workers, "chunksize": chunksize, "device": options.device,
            "rate_mbit": options.rate_mbit, "netlink": netlink().name, "rows": rows,
            "gpu_host_over_same_host": far["events_per_s"] / same["events_per_s"],
            "histograms_equal": far["histograms"] == same["histograms"]}


def table(result: dict) -> str:
    lines = ["| server | events/s | wall s | inference share | bytes sent | histograms |",
             "|---|---|---|---|---|---|"]
    for name, row in result["rows"].items():
        lines.append(f"| {name} | {row['events_per_s']:.0f} | {row['wall_s']:.1f} | "
                     f"{row['inference_share']:.2f} | {row['bytes_sent'] / 1e6:.0f} MB | "
                     f"{'equal' if result['histograms_equal'] else 'DIFFER'} |")
    lines.append(f"\ngpu-host / same-host: {result['gpu_host_over_same_host']:.3f} "
                 f"({result['rate_mbit'] / 1000:g} Gb/s tbf link, netlink via {result['netlink']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--rate-mbit", type=float, default=25_000)
    parser.add_argument("--device", default="gpu", choices=("cpu", "gpu"))
    parser.add_argument("--out", default="bench-output/network")
    options = parser.parse_args(argv)
    result = run(options)
    for row in result["rows"].values():
        row.pop("histograms", None)
    Path(options.out).mkdir(parents=True, exist_ok=True)
    (Path(options.out) / "network_check.json").write_text(json.dumps(result, indent=1))
    print(table(result), flush=True)
    return 0 if result["histograms_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
