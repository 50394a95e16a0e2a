"""The trackgnn pipeline: events/s in-process (direct), served fused and served as an ensemble.

Every client is its own (spawned) process (:class:`coffea_sonic.bench.clients.ClientPool`) that
loops over fixed chunks of ``--events`` events of synthetic hits (:mod:`coffea_sonic.data.hits`),
synchronously, as an analysis worker does:

* ``direct``: ``coffea_sonic.zoo.trackgnn.pipeline(device).run(hits, counts)`` in the client
  process (each client its own pipeline; on ``--device gpu`` its own CUDA context);
* ``fused``: ``TritonModel(url_of("trackgnn"))({"hits": hits}, counts=counts)``;
* ``ensemble``: the same call to ``trackgnn_ensemble`` (a Triton ensemble of the stage models).

Each mode runs with every ``--clients`` count; all clients of a run start together, a client's
rate is its events over the time to its last answer, a run's rate the sum. The served models run
on ``LocalTritonServer(models=["trackgnn", "trackgnn_ensemble"], device=...)`` (torch on CUDA with
``--device gpu``, as the direct runs; both on the one GPU ``--gpu``, default 0). Before timing,
served labels are compared with the direct labels of the same chunk (identical on CPU). GPU busy
is sampled with ``nvidia-smi``.

Writes ``pipeline-<device>.json`` and ``pipeline-<device>.md`` (a table) into ``--out``::

    # GPU machine (carry .device), one command:
    source benchmarks/gpu/triton-gpu-env.sh .device >/dev/null && \
        $PY benchmarks/pipeline_bench.py --device gpu --clients 1 8 --out $OUT
    # here:
    python benchmarks/pipeline_bench.py --device cpu --clients 1 --events 20 --duration 1 --out /tmp/pb

On the GPU machine ``triton-gpu-env.sh`` sets up tritonserver and the model Python (numpy 1.26 +
the machine's torch) and ``$PY``; coffea, awkward and dask are not needed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from coffea_sonic.bench.clients import ClientPool
from coffea_sonic.bench.machine import machine_info

logger = logging.getLogger("pipeline_bench")

MODES = ("direct", "fused", "ensemble")
SERVED = {"fused": "trackgnn", "ensemble": "trackgnn_ensemble"}
#: Different chunks each client cycles through.
CHUNKS_PER_CLIENT = 4


def _chunks(events: int, index: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from coffea_sonic.data.hits import generate_hits

    drawn = generate_hits(events * CHUNKS_PER_CLIENT, seed=1000 + index)
    fields = drawn["fields"]
    rows = np.stack([fields["x"], fields["y"], fields["z"]], axis=1).astype(np.float32)
    counts = drawn["counts"]
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return [(rows[bounds[c * events]:bounds[(c + 1) * events]],
             counts[c * events:(c + 1) * events]) for c in range(CHUNKS_PER_CLIENT)]


def _runner(task: dict, cache: dict) -> Any:
    key = (task["mode"], task.get("url"))
    if key not in cache:
        if task["mode"] == "direct":
            from coffea_sonic.zoo import trackgnn

            pipeline = trackgnn.pipeline(f"cuda:{task['gpu']}" if task["device"] == "gpu"
                                         else "cpu")
            cache[key] = lambda rows, counts: pipeline.run(rows, counts)
        else:
            from coffea_sonic import TritonModel

            model = TritonModel(task["url"])
            cache[key] = lambda rows, counts: model({"hits": rows}, counts=counts)["labels"]
    return cache[key]


def _run_task(task: dict, tasks: Any, control: Any, cache: dict) -> dict:
    chunks = cache.setdefault(("chunks", task["events"], task["index"]),
                              _chunks(task["events"], task["index"]))
    run = _runner(task, cache)
    for rows, counts in chunks[:2]:  # warm-up: connections, kernels
        run(rows, counts)
    control.put(("ready", os.getpid()))
    start_at = tasks.get()
    while time.time() < start_at:
        time.sleep(0.0005)
    end = start_at + task["duration"]
    events = hits = done = 0
    last = start_at
    latencies = []
    while time.time() < end:
        rows, counts = chunks[done % len(chunks)]
        began = time.perf_counter()
        run(rows, counts)
        latencies.append(time.perf_counter() - began)
        events += len(counts)
        hits += len(rows)
        done += 1
        last = time.time()
    elapsed = max(last - start_at, 1e-9)
    return {"events": events, "hits": hits, "elapsed_s": elapsed,
            "events_per_s": events / elapsed if events else 0.0,
            "chunk_ms_p50": 1e3 * float(np.median(latencies)) if latencies else None}


class _Running:
    """A server someone else started (``--server``)."""

    def __init__(self, address: str) -> None:
        self.address = address

    def url(self, name: str) -> str:
        return f"triton+grpc://{self.address}/{name}"

    def stop(self) -> None:
        pass


def _verify(server: Any, device: str, events: int, gpu: int = 0) -> dict:
    """Served labels of one chunk against the direct labels (fraction of hits equal)."""
    from coffea_sonic import TritonModel
    from coffea_sonic.zoo import trackgnn

    rows, counts = _chunks(events, 99)[0]
    direct = trackgnn.pipeline(f"cuda:{gpu}" if device == "gpu" else "cpu").run(rows, counts)
    result = {}
    for mode, name in SERVED.items():
        served = TritonModel(server.url(name))({"hits": rows}, counts=counts)["labels"]
        result[mode] = float(np.mean(served == direct)) if len(rows) else 1.0
    return result


def _stage_ms(device: str, events: int, gpu: int = 0, repeats: int = 5) -> dict:
    """Median ms per stage of one direct call on a chunk (where the pipeline's time goes)."""
    import torch

    from coffea_sonic.zoo import trackgnn

    pipeline = trackgnn.pipeline(f"cuda:{gpu}" if device == "gpu" else "cpu")
    rows, counts = _chunks(events, 98)[0]
    sync = torch.cuda.synchronize if device == "gpu" else (lambda: None)
    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        marks = [time.perf_counter()]

        def mark() -> None:
            sync()
            marks.append(time.perf_counter())

        with torch.inference_mode():
            hits = pipeline._hits(rows)
            embedding = pipeline.embed(hits)
            mark()
            edges = pipeline.graph(hits, embedding, counts)
            mark()
            edges = pipeline.filter(hits, embedding, edges)
            mark()
            edges = pipeline.gnn(hits, edges)
            mark()
            pipeline.components(edges, len(rows), counts)
            mark()
        for stage, (a, b) in zip(("embed", "graph", "filter", "gnn", "cc"),
                                 zip(marks[:-1], marks[1:])):
            times.setdefault(stage, []).append(1e3 * (b - a))
    return {stage: round(float(np.median(values)), 2) for stage, values in times.items()}


def _stats(server: Any, model: str | None) -> Any:
    """Triton's cumulative statistics of a served ``model`` (None for direct runs)."""
    if server is None or model is None:
        return None
    from coffea_sonic.bench.probes import server_statistics, statistics_transport

    address = getattr(server, "grpc_address", None) or server.address
    return server_statistics(statistics_transport(address), model)


def _table(records: list[dict], device: str, events: int) -> str:
    lines = [f"trackgnn pipeline, device {device}, {events} events per call",
             "", "| mode | clients | events/s | hits/s | vs direct (same clients) | call p50 ms "
             "| GPU busy % |", "|---|---|---|---|---|---|---|"]
    for record in records:
        if "error" in record:
            lines.append(f"| {record['mode']} | {record['clients']} | error: "
                         f"{record['error'][:80]} | | | | |")
            continue
        ratio = record.get("ratio")
        lines.append(
            f"| {record['mode']} | {record['clients']} | {record['events_per_s']:.1f} | "
            f"{record['hits_per_s']:.0f} | {'' if ratio is None else f'{ratio:.2f}x'} | "
            f"{record['chunk_ms_p50']:.1f} | "
            f"{'' if record.get('gpu_percent') is None else record['gpu_percent']} |")
    profiles = [(r["mode"], r["clients"], r["server_profile"]) for r in records
                if r.get("server_profile")]
    if profiles:
        lines += ["", "server, ms per request: queue / compute input / compute infer / compute "
                  "output (avg batch)", ""]
        lines += [f"- {mode} x {clients}: {p['queue_ms']} / {p['compute_input_ms']} / "
                  f"{p['compute_infer_ms']} / {p['compute_output_ms']} ({p['avg_batch']})"
                  for mode, clients, p in profiles]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--events", type=int, default=200, help="events per call (chunk)")
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per run")
    parser.add_argument("--gpu", type=int, default=0,
                        help="--device gpu: the one GPU the server and the direct runs use")
    parser.add_argument("--instances", type=int, default=None,
                        help="model instances per GPU (default: LocalTritonServer's)")
    parser.add_argument("--server", default=None, metavar="HOST:PORT",
                        help="use this running server's gRPC address (serving trackgnn and "
                             "trackgnn_ensemble) instead of starting one")
    parser.add_argument("--out", default="bench-output/pipeline")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from coffea_sonic.bench.probes import GpuUtilisation

    records: list[dict] = []
    report = {"machine": machine_info(), "device": args.device, "events_per_call": args.events,
              "duration_s": args.duration, "records": records}
    server = None
    pool = ClientPool(max(args.clients), _run_task)
    gpu = GpuUtilisation().__enter__()
    try:
        if args.server and any(mode in SERVED for mode in args.modes):
            server = _Running(args.server)
            report["served_equals_direct"] = _verify(server, args.device, args.events, args.gpu)
        elif any(mode in SERVED for mode in args.modes):
            from coffea_sonic.server import LocalTritonServer

            began = time.time()
            server = LocalTritonServer(
                models=list(SERVED.values()), device=args.device, instances=args.instances,
                gpus=[args.gpu] if args.device == "gpu" else None, startup_timeout_s=240).start()
            logger.info("server ready in %.1f s", time.time() - began)
            report["served_equals_direct"] = _verify(server, args.device, args.events, args.gpu)
            logger.info("served labels equal to direct (fraction of hits): %s",
                        report["served_equals_direct"])
        report["direct_stage_ms"] = _stage_ms(args.device, args.events, args.gpu)
        logger.info("direct, ms per stage of one call: %s", report["direct_stage_ms"])
        direct: dict[int, float] = {}
        for mode in args.modes:
            for clients in args.clients:
                task = {"mode": mode, "device": args.device, "events": args.events,
                        "duration": args.duration, "gpu": args.gpu}
                if mode in SERVED:
                    task["url"] = server.url(SERVED[mode])
                record: dict = {"mode": mode, "clients": clients}
                before = _stats(server, SERVED.get(mode))
                start_at, results = pool.run(task, clients)
                after = _stats(server, SERVED.get(mode))
                if before is not None and after is not None:
                    # where a served call's time goes on the server: queue, input, run, output
                    from coffea_sonic.bench.probes import server_profile

                    record["server_profile"] = server_profile(before, after, args.duration)
                errors = [r["error"] for r in results if "error" in r]
                if errors:
                    record["error"] = errors[0]
                else:
                    record["events_per_s"] = sum(r["events_per_s"] for r in results)
                    record["hits_per_s"] = sum(r["hits"] / r["elapsed_s"] for r in results)
                    record["chunk_ms_p50"] = float(np.median([r["chunk_ms_p50"] for r in results
                                                              if r["chunk_ms_p50"]] or [0.0]))
                    busy = gpu.mean_between(start_at + 0.2, start_at + args.duration)
                    record["gpu_percent"] = None if busy is None else round(busy, 1)
                    if mode == "direct":
                        direct[clients] = record["events_per_s"]
                    elif direct.get(clients):
                        record["ratio"] = record["events_per_s"] / direct[clients]
                records.append(record)
                logger.info("%s", record)
    finally:
        gpu.__exit__(None, None, None)
        pool.close()
        if server is not None:
            server.stop()
        stem = out / f"pipeline-{args.device}"
        stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
        table = _table(records, args.device, args.events)
        if report.get("direct_stage_ms"):
            table += ("\ndirect, ms per stage of one call: " + ", ".join(
                f"{stage} {ms}" for stage, ms in report["direct_stage_ms"].items()) + "\n")
        stem.with_suffix(".md").write_text(table)
        print(table, flush=True)
    return 1 if any("error" in record for record in records) else 0


if __name__ == "__main__":
    sys.exit(main())
