"""``coffea-sonic bench pipeline``: the trackgnn pipeline, events/s direct, fused, ensemble.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...cliargs import add_device_option, add_list_option, resolve_device
from ...errors import ConfigurationError
from ..clients import ClientPool, ready_then_start, timed_calls
from ..files import table as markdown_table, write_report
from ..machine import machine_info
from ..rounds import merge_rounds
from . import add_numbers, old_spellings, scenario_parser

__all__ = ["MODES", "PipelineConfig", "chunks", "register", "run_pipeline", "table"]

logger = logging.getLogger(__name__)

MODES = ("direct", "fused", "ensemble")
SERVED = {"fused": "trackgnn", "ensemble": "trackgnn_ensemble"}
#: Different chunks each client cycles through.
CHUNKS_PER_CLIENT = 4
_DESCRIPTION = """\
events/s of the trackgnn pipeline (hits -> track labels) in each client process (direct), served
as one fused model (fused) and as a Triton ensemble (ensemble), per --clients count; direct runs
again at the end, or with --rounds N the modes alternate. Writes pipeline-DEVICE.json and .md
into -o DIR. Exit code 1 if a run failed.

examples:
  coffea-sonic bench pipeline --device gpu --clients 1 8          # GPU machine (~1 min)
  coffea-sonic bench pipeline --device gpu --clients 1 --rounds 6  # modes alternating
  coffea-sonic bench pipeline --device cpu --clients 1 --events 20 --duration-s 1 -o /tmp/pb
  coffea-sonic bench pipeline --server host:8001 --modes fused ensemble   # a running server
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``pipeline`` to the ``bench`` scenarios."""
    parser = scenario_parser(subparsers, "pipeline", run=run, description=_DESCRIPTION,
                             help="the trackgnn pipeline: in-process vs served fused vs ensemble")
    add_device_option(parser, default="gpu",
                      help="where the pipeline runs, in the clients and on the server (auto: a "
                           "GPU if nvidia-smi sees one; default: %(default)s)")
    add_list_option(parser, "--clients", type=int, default=[1, 8],
                    help="client process counts, one run each (default: 1 8)")
    add_list_option(parser, "--modes", choices=MODES, default=list(MODES),
                    help="default: all of " + ", ".join(MODES))
    add_numbers(parser, [
        ("--events", int, 200, "events per call (chunk)"),
        ("--duration-s", float, 6.0, "seconds per mode and client count (over all rounds)"),
        ("--rounds", int, 1, "run the modes in this many alternating rounds, each "
                             "duration-s/rounds s; ratios compare the same rounds (1: each mode "
                             "once, direct again at the end)"),
        ("--gpu", int, 0, "--device gpu: the one GPU the server and the direct runs use"),
        ("--instances", int, None, "model instances per GPU (None: LocalTritonServer's)")])
    parser.add_argument("--handoff", choices=("host", "device"), default=None,
                        help="how the ensemble's stages pass tensors to each other: as numpy "
                             "through the host, or as DLPack tensors where they lie (default: "
                             "device on a GPU, host on a CPU)")
    parser.add_argument("--transport", choices=("auto", "grpc", "shm", "cuda", "http"),
                        default="auto",
                        help="how the served modes' clients reach the server (default: "
                             "%(default)s, as TritonModel; grpc is what a worker on another "
                             "host gets)")
    parser.add_argument("--server-arg", dest="server_args", action="append", default=[],
                        metavar="FLAG",
                        help="a tritonserver flag for the server the bench starts; repeat for "
                             "more, e.g. --server-arg=--cuda-memory-pool-byte-size=0:1073741824")
    parser.add_argument("--server", default=None, metavar="HOST:PORT",
                        help="use this running server's gRPC address (serving trackgnn and "
                             "trackgnn_ensemble) instead of starting one")
    return old_spellings(parser, "--out", "--duration")


def run(args: argparse.Namespace) -> int:
    """Run every mode x client count; print the table; exit 1 if a run failed."""
    if args.server and args.server_args:
        raise ConfigurationError(
            f"--server-arg {' '.join(args.server_args)} is for the server the bench starts; with "
            f"--server {args.server} it starts none: pass the flags to that server instead")
    if args.rounds < 1:
        raise ConfigurationError(f"--rounds must be 1 or more, not {args.rounds}")
    config = PipelineConfig(
        device=resolve_device(args.device), clients=args.clients, modes=args.modes,
        events=args.events, duration=args.duration_s, gpu=args.gpu, instances=args.instances,
        server=args.server, handoff=args.handoff, transport=args.transport,
        server_args=args.server_args, rounds=args.rounds)
    report, text = run_pipeline(config, args.output)
    print(text, flush=True)
    return 1 if any("error" in record for record in report["records"]) else 0


def chunks(events: int, index: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``CHUNKS_PER_CLIENT`` chunks of ``events`` events: (hits x, y, z, hits per event)."""
    from ...data.hits import generate_hits

    drawn = generate_hits(events * CHUNKS_PER_CLIENT, seed=1000 + index)
    fields = drawn["fields"]
    rows = np.stack([fields["x"], fields["y"], fields["z"]], axis=1).astype(np.float32)
    counts = drawn["counts"]
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return [(rows[bounds[c * events]:bounds[(c + 1) * events]],
             counts[c * events:(c + 1) * events]) for c in range(CHUNKS_PER_CLIENT)]


def _direct(device: str, gpu: int) -> Any:
    from ...zoo import trackgnn

    return trackgnn.pipeline(f"cuda:{gpu}" if device == "gpu" else "cpu")


def _runner(task: dict, cache: dict) -> Any:
    key = (task["mode"], task.get("url"), task.get("transport"))
    if key not in cache:
        if task["mode"] == "direct":
            cache[key] = _direct(task["device"], task["gpu"]).run
        else:
            from ... import TritonModel

            model = TritonModel(task["url"], transport=task.get("transport", "auto"))
            cache[key] = lambda rows, counts: model({"hits": rows}, counts=counts)["labels"]
    return cache[key]


def _run_task(task: dict, tasks: Any, control: Any, cache: dict) -> dict:
    parts = cache.setdefault(("chunks", task["events"], task["index"]),
                             chunks(task["events"], task["index"]))
    run = _runner(task, cache)
    # warm-up, and each chunk's labels alone, which every answer under load must repeat
    alone = [np.asarray(run(rows, counts)) for rows, counts in parts]
    sums = {"events": 0, "hits": 0, "same": 0}

    def check(done: int, labels: Any) -> None:
        rows, counts = parts[done % len(parts)]
        sums["same"] += int(np.count_nonzero(np.asarray(labels) == alone[done % len(parts)]))
        sums["events"] += len(counts)
        sums["hits"] += len(rows)

    latencies, elapsed = timed_calls(lambda done: run(*parts[done % len(parts)]),
                                     ready_then_start(tasks, control), task["duration"], check)
    events, hits, same, elapsed = sums["events"], sums["hits"], sums["same"], max(elapsed, 1e-9)
    return {"events": events, "hits": hits, "elapsed_s": elapsed,
            "labels_as_alone": same / hits if hits else 1.0,
            "events_per_s": events / elapsed if events else 0.0,
            "chunk_ms_p50": 1e3 * float(np.median(latencies)) if latencies else None}


def _verify(server: Any, device: str, events: int, gpu: int = 0,
            transport: str = "auto") -> dict:
    """Served labels of one chunk against the direct labels (fraction of hits equal)."""
    from ... import TritonModel

    rows, counts = chunks(events, 99)[0]
    direct = _direct(device, gpu).run(rows, counts)
    return {mode: float(np.mean(TritonModel(server.url(name), transport=transport)(
        {"hits": rows}, counts=counts)["labels"] == direct)) if len(rows) else 1.0
        for mode, name in SERVED.items()}


def _stage_ms(device: str, events: int, gpu: int = 0, repeats: int = 5) -> dict:
    """Median ms per stage of one direct call on a chunk (where the pipeline's time goes)."""
    pipeline = _direct(device, gpu)
    rows, counts = chunks(events, 98)[0]
    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        timings: dict[str, float] = {}
        pipeline.run(rows, counts, timings=timings)
        for stage, ms in timings.items():
            times.setdefault(stage, []).append(ms)
    return {stage: round(float(np.median(values)), 2) for stage, values in times.items()}


def served_stage_ms(path: str | None) -> dict:
    """Median ms per served model's ``execute`` and, fused, per pipeline stage, from the lines the
    served models append to ``$TRACKGNN_STAGE_TIMES`` (empty where it was not set).

    >>> served_stage_ms(None)
    {}
    """
    if not path or not Path(path).exists():
        return {}
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    medians: dict = {}
    for stage in sorted({line["stage"] for line in lines}):
        mine = [line for line in lines if line["stage"] == stage]
        keys = [key for key in mine[0] if key not in ("stage", "pid", "at", "requests")]
        medians[stage] = {key: round(float(np.median([line.get(key, 0.0) for line in mine])), 2)
                          for key in keys}
        medians[stage]["executes"] = len(mine)
    return medians


def _cells(record: dict) -> list:
    if "error" in record:  # one cell to the end of the row
        return [record["mode"], record["clients"], f"error: {record['error'][:80]} | | | |"]
    ratio, rounds = record.get("ratio"), record.get("round_ratios")
    shown = ("" if ratio is None else f"{ratio:.2f}x") + (
        f" (rounds {min(rounds):.2f}-{max(rounds):.2f})" if rounds else "")
    return [record["mode"] + (" (again)" if record.get("again") else ""), record["clients"],
            f"{record['events_per_s']:.1f}", f"{record['hits_per_s']:.0f}", shown,
            f"{record['chunk_ms_p50']:.1f}",
            "" if record.get("gpu_percent") is None else record["gpu_percent"]]


def table(records: list[dict], device: str, events: int) -> str:
    """The Markdown table of the runs, with labels that changed under load and server profiles."""
    lines = [f"trackgnn pipeline, device {device}, {events} events per call", "",
             *markdown_table(["mode", "clients", "events/s", "hits/s", "vs direct (same clients)",
                            "call p50 ms", "GPU busy %"], map(_cells, records))]
    changed = [f"{r['mode']} x {r['clients']}: {r['labels_as_alone']:.6f}" for r in records
               if r.get("labels_as_alone", 1.0) < 1.0]
    if changed:
        lines += ["", "labels under load differ from the same chunk's alone (share of hits "
                  "alike, worst client): " + "; ".join(changed)]
    profiles = [(r["mode"], r["clients"], r["server_profile"]) for r in records
                if r.get("server_profile")]
    if profiles:
        lines += ["", "server, ms per request: queue / compute input / compute infer / compute "
                  "output (avg batch)", ""]
        lines += [f"- {mode} x {clients}: {p['queue_ms']} / {p['compute_input_ms']} / "
                  f"{p['compute_infer_ms']} / {p['compute_output_ms']} ({p['avg_batch']})"
                  for mode, clients, p in profiles]
    return "\n".join(lines) + "\n"


@dataclass
class PipelineConfig:
    """What one pipeline benchmark runs (``server``: a running server's ``HOST:PORT``; ``rounds``
    > 1: the modes alternate in windows of ``duration / rounds`` s).

    >>> PipelineConfig(device="cpu", clients=[1]).modes
    ['direct', 'fused', 'ensemble']
    """

    device: str = "gpu"
    clients: list[int] = field(default_factory=lambda: [1, 8])
    modes: list[str] = field(default_factory=lambda: list(MODES))
    events: int = 200
    duration: float = 6.0
    gpu: int = 0
    instances: int | None = None
    server: str | None = None
    handoff: str | None = None
    transport: str = "auto"
    server_args: list[str] = field(default_factory=list)
    rounds: int = 1


def _start_server(config: PipelineConfig, report: dict) -> Any:
    """The server of the served modes (None when only ``direct`` runs), its labels checked."""
    if not any(mode in SERVED for mode in config.modes):
        return None
    if config.server:  # someone else's: nothing to stop
        server: Any = SimpleNamespace(grpc_address=config.server, stop=lambda: None,
                                      url=lambda name: f"triton+grpc://{config.server}/{name}")
    else:
        from ...server import LocalTritonServer

        began = time.time()
        server = LocalTritonServer(
            models=list(SERVED.values()), device=config.device, instances=config.instances,
            gpus=[config.gpu] if config.device == "gpu" else None, startup_timeout_s=240,
            repository_options={"handoff": config.handoff} if config.handoff else None,
            extra_args=config.server_args).start()
        logger.info("server ready in %.1f s", time.time() - began)
    report["served_equals_direct"] = _verify(server, config.device, config.events, config.gpu,
                                             config.transport)
    logger.info("served labels equal to direct (fraction of hits): %s",
                report["served_equals_direct"])
    return server


def _measure(config: PipelineConfig, mode: str, clients: int, server: Any, pool: ClientPool,
             gpu: Any) -> dict:
    """One run: ``clients`` processes calling ``mode`` together for ``config.duration`` s."""
    task = {"mode": mode, "device": config.device, "events": config.events,
            "duration": config.duration, "gpu": config.gpu, "transport": config.transport}
    if mode in SERVED:
        task["url"] = server.url(SERVED[mode])
    record: dict = {"mode": mode, "clients": clients}
    window = pool.measure(task, clients, gpu=gpu, model=SERVED.get(mode),
                          server=None if server is None else server.grpc_address)
    if window["server_profile"]:  # where a served call's time goes: queue, input, run, output
        record["server_profile"] = window["server_profile"]
    results = window["results"]
    if window["errors"]:
        record["error"] = window["errors"][0]
        return record
    record["events_per_s"] = sum(r["events_per_s"] for r in results)
    record["hits_per_s"] = sum(r["hits"] / r["elapsed_s"] for r in results)
    record["chunk_ms_p50"] = float(np.median([r["chunk_ms_p50"] for r in results
                                              if r["chunk_ms_p50"]] or [0.0]))
    # the worst client: the share of its hits labelled as when its chunk ran alone
    record["labels_as_alone"] = min(r["labels_as_alone"] for r in results)
    record["gpu_percent"] = window["gpu_percent"]
    return record


def _plan(config: PipelineConfig) -> list[tuple[str, int, dict]]:
    """(mode, clients, what the record adds) in the order they run: with ``rounds`` > 1 every mode
    in each round per client count; else each mode per client count, then direct once more (the
    direct rate moves between runs: the served ones compare with the mean of both)."""
    if config.rounds > 1:
        return [(mode, clients, {"round": index}) for clients in config.clients
                for index in range(config.rounds) for mode in config.modes]
    again = "direct" in config.modes and len(config.modes) > 1
    return ([(mode, clients, {}) for mode in config.modes for clients in config.clients]
            + [("direct", clients, {"again": True}) for clients in config.clients if again])


def add_ratios(records: list[dict]) -> None:
    """Each served record's ``ratio``: its events/s over the mean direct events/s of the same
    client count (the direct run before the served ones and, where there is one, after).

    >>> records = [{"mode": "direct", "clients": 1, "events_per_s": 90.0},
    ...            {"mode": "fused", "clients": 1, "events_per_s": 80.0},
    ...            {"mode": "direct", "clients": 1, "events_per_s": 110.0, "again": True}]
    >>> add_ratios(records); records[1]["ratio"]
    0.8
    """
    direct: dict[int, list[float]] = {}
    for record in records:
        if record["mode"] == "direct" and "error" not in record:
            direct.setdefault(record["clients"], []).append(record["events_per_s"])
    for record in records:
        rates = direct.get(record["clients"])
        if record["mode"] != "direct" and "error" not in record and rates:
            record["ratio"] = record["events_per_s"] / float(np.mean(rates))


def _page(report: dict) -> str:
    text = table(report["records"], report["device"], report["events_per_call"])
    if report.get("direct_stage_ms"):
        text += ("\ndirect, ms per stage of one call: " + ", ".join(
            f"{stage} {ms}" for stage, ms in report["direct_stage_ms"].items()) + "\n")
    if report["served_stage_ms"]:
        text += "\nserved, median ms per execute (stages with the device synchronised): " + \
            "; ".join(f"{stage}: {ms}" for stage, ms in report["served_stage_ms"].items()) + "\n"
    return text


def run_pipeline(config: PipelineConfig, out: str | Path) -> tuple[dict, str]:
    """Every mode with every client count; the report and its table, both written into ``out``
    (also when a run fails half-way). A record holds ``error`` where a client failed."""
    from ...server.pipelines import handoff_for
    from ..probes import GpuUtilisation

    records: list[dict] = []
    report = {"machine": machine_info(), "device": config.device,
              "events_per_call": config.events, "duration_s": config.duration,
              "handoff": handoff_for(config.device, config.handoff),
              "transport": config.transport, "server_args": config.server_args,
              "rounds": config.rounds, "records": records}
    server = None
    pool = ClientPool(max(config.clients), _run_task)
    gpu = GpuUtilisation().__enter__()
    try:
        server = _start_server(config, report)
        report["direct_stage_ms"] = _stage_ms(config.device, config.events, config.gpu)
        logger.info("direct, ms per stage of one call: %s", report["direct_stage_ms"])
        # rounds: the windows merged per mode and client count are the records
        runs = report.setdefault("windows", []) if config.rounds > 1 else records
        window = replace(config, duration=config.duration / config.rounds)
        for mode, clients, extra in _plan(config):
            runs.append({**_measure(window, mode, clients, server, pool, gpu), **extra})
            logger.info("%s", runs[-1])
        if runs is not records:
            records.extend(merge_rounds(runs))
    finally:
        add_ratios(records)
        gpu.__exit__(None, None, None)
        pool.close()
        if server is not None:
            server.stop()
        report["served_stage_ms"] = served_stage_ms(os.environ.get("TRACKGNN_STAGE_TIMES"))
        text = write_report(report, out, f"pipeline-{config.device}", _page)
    return report, text
