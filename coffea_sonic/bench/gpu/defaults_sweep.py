"""Served vs in-process throughput on one GPU at the defaults (and on every GPU of a machine).
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coffea_sonic.bench.clients import ClientPool
from coffea_sonic.bench.gpu.defaults_plans import (CHUNK_ROWS, PLANS, MiB, Run, Server, plan_final,
                                                   run_task)
from coffea_sonic.bench.machine import machine_info
from coffea_sonic.bench.files import cell, table, write_report
from coffea_sonic.bench.report import format_rate

logger = logging.getLogger("defaults_sweep")


def describe_client(run: Run) -> str:
    """The client column's words for ``run``: its kind, else its TritonModel options."""
    fixed = {"verify": "served == in-process check", "local": "in-process engine"}
    if run.kind in fixed:
        return fixed[run.kind]
    words = {"max_request_bytes": lambda value: f"{value / MiB:g} MiB",
             "max_in_flight": lambda value: f"{value} in flight"}
    return ", ".join(words.get(key, str)(value)
                     for key, value in run.client.items()) or "TritonModel()"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", default="final", choices=sorted(PLANS))
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds per run (default: final 4, others 2; 8+ processes +0.5)")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="start no run after this many seconds (the JSON is written anyway)")
    parser.add_argument("--out", default="bench-output/defaults")
    parser.add_argument("--tag", default=None)
    parser.add_argument("--device", default="gpu", choices=["cpu", "gpu"])
    parser.add_argument("--no-16", action="store_true", help="final plan: leave out 16 processes")
    parser.add_argument("--only", default=None,
                        help="comma list of server-config names (substrings) to run")
    return parser


def _plan(args: argparse.Namespace) -> list[Server]:
    """The plan ``--plan`` names, narrowed to ``--only``'s server configurations."""
    plan = plan_final(not args.no_16) if args.plan == "final" else PLANS[args.plan]()
    if args.only:
        wanted = args.only.split(",")
        plan = [s for s in plan if s.name.startswith("in-process")
                or any(w in s.name for w in wanted)]
    return plan


@dataclass
class _Sweep:
    """One sweep's state: its options and clock, the report and its path (no suffix), the pool,
    the GPUs."""

    args: argparse.Namespace
    duration: float
    path: Path
    report: dict
    models: list[str]
    began: float = field(default_factory=time.time)
    pool: Any = None
    gpu: Any = None
    baseline: dict[str, float] = field(default_factory=dict)

    def over_budget(self) -> bool:
        return time.time() - self.began > self.args.budget

    def write(self) -> str:
        """The report so far as JSON, its table as Markdown (returned)."""
        return write_report(self.report, self.path.parent, self.path.name,
                            lambda report: summary_markdown(report) + "\n")


def main(argv: list[str] | None = None) -> int:
    from coffea_sonic import zoo
    from coffea_sonic.bench.probes import GpuUtilisation

    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    plan = _plan(args)
    duration = args.duration or (4.0 if args.plan == "final" else 2.0)
    report = {"machine": machine_info(), "plan": args.plan, "duration_s": duration,
              "records": [], "chunk_rows": CHUNK_ROWS}
    logger.info("machine: %s", report["machine"])
    sweep = _Sweep(args, duration, Path(args.out) / f"defaults-{args.tag or args.plan}",
                   report, sorted({run.model for server in plan for run in server.runs}))
    for name in sweep.models:  # made or cached once, before client processes need them
        zoo.onnx_path(name)
    with GpuUtilisation() as sweep.gpu:
        sweep.pool = ClientPool(max(run.procs for server in plan for run in server.runs),
                                run_task)
        try:
            for config in plan:
                if not _run_config(sweep, config):
                    break
        finally:
            sweep.pool.close()
    report["baseline_rows_per_s"] = sweep.baseline
    report["elapsed_s"] = round(time.time() - sweep.began, 1)
    print(sweep.write(), end="")
    return 0


def _run_config(sweep: _Sweep, config: Server) -> bool:
    """Start ``config``'s server (where a run needs one) and measure its runs; False once the
    time budget is spent."""
    from coffea_sonic.server import LocalTritonServer

    server = None
    if any(run.kind != "local" for run in config.runs):
        if sweep.over_budget():
            return False
        t0 = time.time()
        try:  # a default config has no instances nor options: LocalTritonServer's defaults
            server = LocalTritonServer(models=sweep.models, device=sweep.args.device,
                                       instances=config.instances,
                                       repository_options=config.options,
                                       startup_timeout_s=240).start()
        except Exception as error:  # noqa: BLE001 - report it and go on
            logger.error("%s: server did not start: %s", config.name, error)
            sweep.report["records"].append({"server": config.name,
                                            "error": f"server start: {error}"[:3000]})
            return True
        logger.info("%s: server ready in %.1f s", config.name, time.time() - t0)
    try:
        for run in config.runs:
            if sweep.over_budget():
                logger.warning("time budget spent: the remaining runs are left out")
                return False
            _run_one(sweep, run, config, server)
    finally:
        if server is not None:
            server.stop()
    return True


def _run_one(sweep: _Sweep, run: Run, config: Server, server) -> None:
    """Measure one run, log it and write the JSON so far; a fresh pool after a client died."""
    record = measure(run, config, server, sweep.pool, sweep.gpu, sweep.duration, sweep.args.device)
    baseline = sweep.baseline
    if run.kind == "local":
        baseline.setdefault(run.model, record.get("rows_per_s") or 0)
    reference = baseline.get(run.model)
    if reference and run.kind != "local" and record.get("rows_per_s"):
        record["ratio"] = round(record["rows_per_s"] / reference, 3)
    sweep.report["records"].append(record)
    logger.info("%-34s %-30s %-10s procs=%-2d %10s rows/s  ratio=%s  gpu=%s%%  "
                "server=%s client=%s %s", config.name, describe_client(run),
                run.model, run.procs, format_rate(record.get("rows_per_s")),
                record.get("ratio"), record.get("gpu_busy"), record.get("profile"),
                record.get("client_summary"), record.get("errors") or "")
    sweep.write()
    if "died" in " ".join(record.get("errors", [])):
        sweep.pool.close()
        sweep.pool = ClientPool(sweep.pool.size, run_task)


def measure(run: Run, config: Server, server, pool: ClientPool, gpu: Any, duration: float,
            device: str) -> dict:
    rows = CHUNK_ROWS[run.model]
    seconds = duration + (0.5 if run.procs >= 8 else 0.0)
    task = {"kind": run.kind, "model": run.model, "rows": rows, "client": run.client,
            "duration": seconds, "device": device,
            "url": server.url(run.model) if server is not None else None,
            "grpc": server.grpc_address if server is not None else None}
    record: dict[str, Any] = {"server": config.name, "instances": config.instances,
                              "server_options": config.options, "default_server": config.default,
                              "kind": run.kind, "client": describe_client(run),
                              "client_options": run.client, "model": run.model, "rows": rows,
                              "procs": run.procs}
    served = server is not None and run.kind != "local"
    try:
        window = pool.measure(task, run.procs, server=server.grpc_address if served else None,
                              model=run.model, gpu=gpu)
    except RuntimeError as error:
        record["errors"] = [str(error)]
        return record
    good = [r for r in window["results"] if "error" not in r]
    record["errors"] = window["errors"]
    if run.kind == "verify":
        record["max_abs_diff"] = good[0]["max_abs_diff"] if good else None
        return record
    record["rows_per_s"] = round(sum(r["rows_per_s"] for r in good)) if good else None
    record["per_process"] = [round(r["rows_per_s"]) for r in good]
    transports = sorted({str(r.get("transport")) for r in good if r.get("transport")})
    if transports:  # what TritonModel chose in the client processes
        record["transport"] = "/".join(transports)
        record["client"] += f" [{record['transport']}]"
    record["chunk_ms_p50"] = round(float(np.median([r["chunk_ms_p50"] for r in good
                                                     if r["chunk_ms_p50"]])), 3) if good else None
    record["gpu_busy"] = window["gpu_percent"]
    record["duration_s"] = seconds
    if served:
        profile = record["server_profile"] = window["server_profile"]
        record["profile"] = (f"{profile['queue_ms']}/{profile['compute_input_ms']}/"
                            f"{profile['compute_infer_ms']}/{profile['compute_output_ms']} "
                            f"b={profile['avg_batch']}")
    clients = [r["client"] for r in good if "client" in r]
    if clients:
        record["client_profile"] = clients[0]
        record["client_summary"] = (f"{clients[0]['requests_per_chunk']} req/chunk, "
                            f"{clients[0]['request_latency_ms']} ms/req")
    return record


def _cells(r: dict, base: dict) -> list:
    """A run's table row: its rate beside in-process's; a verify run's max |diff|; the error."""
    if r.get("kind") == "verify":
        diff = r.get("max_abs_diff")
        return [r["server"], "served vs in-process, max abs diff", r["model"], 1,
                "ERROR " + "; ".join(r.get("errors") or []) if diff is None else f"{diff:.2e}",
                *[""] * 5]
    if r.get("rows_per_s") is None:
        errors = "; ".join(r.get("errors") or [r.get("error", "")])[:300]
        return [r.get("server"), r.get("client", ""), r.get("model", ""), r.get("procs", ""),
                f"ERROR {errors}"]
    return [r["server"], r["client"], r["model"], r["procs"], format_rate(r["rows_per_s"]),
            format_rate(base.get(r["model"])), r.get("ratio", "–"), cell(r.get("gpu_busy")),
            r.get("chunk_ms_p50"), r.get("profile", "–")]


def summary_markdown(report: dict) -> str:
    """The sweep's markdown table, under a line that names the machine (card, cores) and date.

    >>> machine = {"gpus": ["NVIDIA H100 80GB HBM3, 81559 MiB, 550.54"], "cpu_cores": 16,
    ...            "cpu_model": "Intel Xeon", "date": "2026-11-27"}
    >>> print(summary_markdown({"machine": machine, "plan": "smoke", "duration_s": 1.0,
    ...                         "records": []}).splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
    card: NVIDIA H100 80GB HBM3, 81559 MiB, 550.54; 16 cores (Intel Xeon); date 2026-11-27;
    plan smoke; 1.0 s per run; chunks: emtrk_cnn 2048 rows, jet_tagger 65536
    """
    m = report["machine"]
    card = " + ".join(m.get("gpus") or []) or "none"
    lines = [f"card: {card}; {m.get('cpu_cores')} cores ({m.get('cpu_model', '?')}); "
             f"date {m.get('date')}; plan {report['plan']}; {report['duration_s']} s per run; "
             f"chunks: emtrk_cnn {CHUNK_ROWS['emtrk_cnn']} rows, jet_tagger {CHUNK_ROWS['jet_tagger']}",
             "", *table(["server", "client", "model", "procs", "rows/s", "in-process", "ratio",
                         "GPU %", "chunk ms", "server queue/in/infer/out ms, avg batch"],
                        [_cells(r, report.get("baseline_rows_per_s") or {})
                         for r in report["records"]], "lllrrrrrr")]
    if report["plan"] == "final":
        lines += ["", "targets: emtrk_cnn 1 process >= 0.7x, 8 processes >= 0.9x with GPU "
                  ">= 80 %; jet_tagger 8 processes >= 1x"]
        for r in report["records"]:
            if r.get("default_server") and r.get("ratio") is not None:
                goal = {("emtrk_cnn", 1): 0.7, ("emtrk_cnn", 8): 0.9,
                        ("jet_tagger", 8): 1.0}.get((r["model"], r["procs"]))
                if goal is None:
                    continue
                busy_goal = r["model"] == "emtrk_cnn" and r["procs"] == 8
                met = r["ratio"] >= goal and (not busy_goal or (r.get("gpu_busy") or 0) >= 80)
                busy = f", GPU {r.get('gpu_busy')} % (goal 80)" if busy_goal else ""
                lines.append(f"- {r['model']} x {r['procs']}: {r['ratio']}x (goal {goal}x{busy}): "
                             f"{'met' if met else 'NOT met'}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
