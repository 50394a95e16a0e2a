"""Soak test of TritonModel: many requests, no growth in open file descriptors, bounded RSS.

Starts real embedded tritonservers (jet_tagger only) and sends ``--requests`` gRPC requests
through :class:`coffea_sonic.TritonModel` the way an analysis does: pipelined calls
(``infer_async``), a fresh unpickled model every ``--chunk`` calls (what coffea's Runner does per
chunk), rejected bad inputs now and then (the error path), and, with ``--servers 2``, both servers
balanced. ``--transport`` is TritonModel's (``auto``: shared memory to these local servers). Every
``--report-every`` requests it samples this process's open file descriptors, threads, RSS, gRPC
channels and shared-memory regions; it fails (exit 1) if descriptors grow by more than
``--max-fd-growth``, RSS by more than ``--max-rss-growth-mb`` after the warm-up sample, or regions
beyond the slot pool's bound.

    python benchmarks/soak.py                      # 10k requests, 1 server
    python benchmarks/soak.py --servers 2 --json soak.json
    python benchmarks/soak.py --transport grpc     # tensors in the gRPC message
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import threading
import time
from collections import deque

import numpy as np
import psutil

from coffea_sonic import zoo
from coffea_sonic.errors import InputValidationError
from coffea_sonic.model import TritonModel
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.transport.grpc import channel
from coffea_sonic.transport.registry import open_transport
from coffea_sonic.transport.shm.pool import DEFAULT_MAX_SLOTS


def _open_fds() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


def _shm_regions(model: TritonModel) -> int:
    """Regions this process holds for ``model``'s servers (0 unless it uses shared memory)."""
    if model.transport_kind != "shm":
        return 0
    return sum(len(open_transport(settings, "shm").regions()) for settings in model.servers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=256, help="rows per request")
    parser.add_argument("--requests-per-call", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=25, help="calls per unpickled model copy")
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--transport", default="auto", choices=["auto", "grpc", "shm"])
    parser.add_argument("--report-every", type=int, default=1000)
    parser.add_argument("--max-fd-growth", type=int, default=8)
    parser.add_argument("--max-rss-growth-mb", type=float, default=64.0)
    parser.add_argument("--json", help="write the samples and verdict here")
    args = parser.parse_args(argv)

    servers = [LocalTritonServer(models=["jet_tagger"], device="cpu").start()
               for _ in range(args.servers)]
    process = psutil.Process()
    samples: list[dict] = []
    try:
        urls = [server.url("jet_tagger") for server in servers]
        template = TritonModel(urls if len(urls) > 1 else urls[0], max_in_flight=4,
                               max_request_bytes=args.rows * 6 * 4, transport=args.transport)
        rows_per_call = args.rows * args.requests_per_call
        inputs = zoo.example_inputs("jet_tagger", rows_per_call, seed=1)
        expected = template(inputs)["probs"].copy()
        bad = {"features": inputs["features"].astype(np.float64)}
        blob = pickle.dumps(template)
        sent = calls = errors = 0
        next_report = 0
        started = time.perf_counter()
        model = pickle.loads(blob)
        pending: deque = deque()
        while sent < args.requests:
            if calls and calls % args.chunk == 0:
                model = pickle.loads(blob)  # a new chunk: a fresh copy finds the pooled channel
            if calls % 97 == 0:
                try:
                    model(bad)
                except InputValidationError:
                    errors += 1
            pending.append(model.infer_async(inputs))
            calls += 1
            sent += args.requests_per_call
            if len(pending) >= 2:
                if not np.array_equal(pending.popleft().result()["probs"], expected):
                    raise SystemExit("soak: outputs changed during the run")
            if sent >= next_report:
                while pending:
                    pending.popleft().result()
                samples.append({
                    "requests": sent, "seconds": round(time.perf_counter() - started, 2),
                    "open_fds": _open_fds(), "threads": threading.active_count(),
                    "rss_mb": round(process.memory_info().rss / 2**20, 1),
                    "channels": channel.pool_size(), "shm_regions": _shm_regions(template),
                })
                print("  ".join(f"{key}={value}" for key, value in samples[-1].items()),
                      flush=True)
                next_report += args.report_every
        while pending:
            pending.popleft().result()
    finally:
        for server in servers:
            server.stop()
    baseline = samples[1] if len(samples) > 1 else samples[0]  # after warm-up
    final = samples[-1]
    fd_growth = max(s["open_fds"] for s in samples[1:] or samples) - baseline["open_fds"]
    rss_growth = final["rss_mb"] - baseline["rss_mb"]
    max_regions = max(s["shm_regions"] for s in samples)
    ok = (fd_growth <= args.max_fd_growth and rss_growth <= args.max_rss_growth_mb
          and max_regions <= DEFAULT_MAX_SLOTS * args.servers)
    verdict = {
        "requests": sent, "calls": calls, "rejected_bad_inputs": errors, "servers": args.servers,
        "transport": template.transport_kind, "shm_regions_max": max_regions,
        "rows_per_request": args.rows, "seconds": final["seconds"],
        "requests_per_s": round(sent / final["seconds"], 1),
        "fd_growth_after_warmup": fd_growth, "rss_growth_mb_after_warmup": round(rss_growth, 1),
        "rss_mb_final": final["rss_mb"], "channels_final": final["channels"], "ok": ok,
    }
    print(json.dumps(verdict, indent=2))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"verdict": verdict, "samples": samples}, out, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
