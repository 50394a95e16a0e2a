"""``coffea-sonic bench soak``: many requests through TritonModel; descriptors and RSS stay flat.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..files import write_json
from . import add_json_file, add_numbers, old_spellings, scenario_parser

__all__ = ["SoakConfig", "judge", "register", "run_soak"]

_DESCRIPTION = """\
Sends --requests requests through TritonModel to embedded tritonservers (jet_tagger) as an
analysis does, sampling descriptors, threads, RSS, gRPC channels and shared-memory regions every
--report-every requests. Exit code 1 if they grow past the bounds after warm-up. Writes the
verdict and samples into -o DIR/soak.json (and --json-file FILE).

examples:
  coffea-sonic bench soak                         # 10k requests, 1 server (about a minute)
  coffea-sonic bench soak --servers 2 --json-file soak.json
  coffea-sonic bench soak --transport grpc        # tensors in the gRPC message
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``soak`` to the ``bench`` scenarios."""
    parser = scenario_parser(
        subparsers, "soak", run=run, description=_DESCRIPTION,
        help="many requests through TritonModel: no growth of descriptors or memory")
    add_numbers(parser, [
            ("--requests", int, 10_000, "requests in all"),
            ("--rows", int, 256, "rows per request"),
            ("--requests-per-call", int, 4, "requests each call is split into"),
            ("--chunk", int, 25, "calls per unpickled model copy"),
            ("--servers", int, 1, "embedded servers, balanced"),
            ("--report-every", int, 1000, "requests between samples"),
            ("--max-fd-growth", int, 8, "open descriptors the run may add after warm-up"),
            ("--max-rss-growth-mb", float, 64.0, "RSS the run may add after warm-up, MB")])
    parser.add_argument("--transport", default="auto", choices=["auto", "grpc", "shm"],
                        help="TritonModel's transport (default: auto: shared memory here)")
    add_json_file(parser, "the verdict and samples")
    return old_spellings(parser, "--json")


def run(args: argparse.Namespace) -> int:
    """Print the verdict; exit 1 if a bound was passed."""
    options = {field.name for field in fields(SoakConfig)} - {"urls"}
    verdict, samples = run_soak(SoakConfig(**{name: getattr(args, name) for name in options}))
    print(json.dumps(verdict, indent=2))
    write_json({"verdict": verdict, "samples": samples}, args.output, "soak.json", args.json_file)
    return 0 if verdict["ok"] else 1


@dataclass
class SoakConfig:
    """How long and how the soak runs, and the growth it tolerates (``urls``: running servers'
    jet_tagger to soak instead of starting ``servers``)."""

    requests: int = 10_000
    rows: int = 256
    requests_per_call: int = 4
    chunk: int = 25
    servers: int = 1
    transport: str = "auto"
    report_every: int = 1000
    max_fd_growth: int = 8
    max_rss_growth_mb: float = 64.0
    urls: tuple[str, ...] = ()


def _sample(sent: int, started: float, template: Any) -> dict:
    from ...transport.grpc import channel
    from ...transport.registry import open_transport
    from ..probes import current_rss_bytes

    regions = (sum(len(open_transport(settings, "shm").regions()) for settings in template.servers)
               if template.transport_kind == "shm" else 0)
    return {"requests": sent, "seconds": round(time.perf_counter() - started, 2),
            "open_fds": len(os.listdir(f"/proc/{os.getpid()}/fd")),
            "threads": threading.active_count(), "rss_mb": round(current_rss_bytes() / 2**20, 1),
            "channels": channel.pool_size(), "shm_regions": regions}


def _drive(template: Any, config: SoakConfig, samples: list[dict]) -> dict:
    """Send the requests, a sample every ``report_every``; the counts sent."""
    import pickle
    from collections import deque

    from ... import zoo
    from ...errors import InputValidationError

    inputs = zoo.example_inputs("jet_tagger", config.rows * config.requests_per_call, seed=1)
    expected = template(inputs)["probs"].copy()
    bad = {"features": inputs["features"].astype(np.float64)}
    blob = pickle.dumps(template)
    sent = calls = errors = next_report = 0
    started = time.perf_counter()
    model = pickle.loads(blob)
    pending: deque = deque()
    while sent < config.requests:
        if calls and calls % config.chunk == 0:
            model = pickle.loads(blob)  # a new chunk: a fresh copy finds the pooled channel
        if calls % 97 == 0:
            try:
                model(bad)
            except InputValidationError:
                errors += 1
        pending.append(model.infer_async(inputs))
        calls += 1
        sent += config.requests_per_call
        if len(pending) >= 2 and not np.array_equal(pending.popleft().result()["probs"],
                                                    expected):
            raise SystemExit("soak: outputs changed during the run")
        if sent >= next_report:
            while pending:
                pending.popleft().result()
            samples.append(_sample(sent, started, template))
            print("  ".join(f"{key}={value}" for key, value in samples[-1].items()), flush=True)
            next_report += config.report_every
    while pending:
        pending.popleft().result()
    return {"requests": sent, "calls": calls, "rejected_bad_inputs": errors,
            "transport": template.transport_kind}


def judge(samples: list[dict], config: SoakConfig, sent: int | None = None) -> dict:
    """The verdict of a run's samples: growth after the warm-up sample, against the bounds."""
    from ...transport.shm.pool import DEFAULT_MAX_SLOTS

    baseline = samples[1] if len(samples) > 1 else samples[0]  # after warm-up
    final = samples[-1]
    fd_growth = max(s["open_fds"] for s in samples[1:] or samples) - baseline["open_fds"]
    rss_growth = final["rss_mb"] - baseline["rss_mb"]
    max_regions = max(s["shm_regions"] for s in samples)
    ok = (fd_growth <= config.max_fd_growth and rss_growth <= config.max_rss_growth_mb
          and max_regions <= DEFAULT_MAX_SLOTS * (len(config.urls) or config.servers))
    return {"servers": config.servers, "shm_regions_max": max_regions,
            "rows_per_request": config.rows, "seconds": final["seconds"],
            "requests_per_s": round((sent or final["requests"]) / final["seconds"], 1),
            "fd_growth_after_warmup": fd_growth,
            "rss_growth_mb_after_warmup": round(rss_growth, 1),
            "rss_mb_final": final["rss_mb"], "channels_final": final["channels"], "ok": ok}


def run_soak(config: SoakConfig) -> tuple[dict, list[dict]]:
    """Start the servers (unless ``config.urls``), soak, stop them; the verdict and samples."""
    from ...model import TritonModel
    from ...server import LocalTritonServer

    servers = [] if config.urls else [LocalTritonServer(models=["jet_tagger"], device="cpu").start()
                                      for _ in range(config.servers)]
    samples: list[dict] = []
    try:
        urls = list(config.urls) or [server.url("jet_tagger") for server in servers]
        template = TritonModel(urls if len(urls) > 1 else urls[0], max_in_flight=4,
                               max_request_bytes=config.rows * 6 * 4, transport=config.transport)
        counts: dict[str, Any] = _drive(template, config, samples)
    finally:
        for server in servers:
            server.stop()
    return {**counts, **judge(samples, config, counts["requests"])}, samples
