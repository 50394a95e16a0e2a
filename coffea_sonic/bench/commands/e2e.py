"""``coffea-sonic bench e2e``: the analysis end to end on this machine, every way to infer, and
its report (results.json, results.md with the table for RESULTS.md, e2e_machine.png).
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from ...cliargs import add_list_option
from ..files import cell, pyplot, save_figure, table, write_report
from . import print_finished, progress_printer, scenario_parser


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``e2e`` to the ``bench`` scenarios."""
    parser = scenario_parser(
        subparsers, "e2e", run=run,
        help="the demo analysis end to end: in-process CPU / GPU vs served on 1, 2, 4 GPUs",
        description=(
            "The demo analysis end to end on this machine (a GPU node): in-process CPU, "
            "in-process GPU in every worker, and served on the first 1, 2, 4 GPUs (those the "
            "machine has). Writes results.json, results.md and e2e_machine.png.\n\n"
            "example:\n  coffea-sonic bench e2e --events 1000000 --workers 15 -o e2e"))
    parser.add_argument("--events", type=int, default=1_000_000, metavar="N",
                        help="events per dataset (default: %(default)s)")
    parser.add_argument("--workers", type=int, metavar="W",
                        help="Dask workers (default: one per core but one)")
    add_list_option(parser, "--gpus", type=int, metavar="K",
                    help="serve on the first K GPUs, one run per K that this machine has "
                         "(default: 1 2 4)")
    parser.add_argument("--no-local-gpu", action="store_true",
                        help="leave out the in-process GPU run")
    return parser


def run(args: argparse.Namespace) -> int:
    """results.json, results.md and e2e_machine.png in ``--output``."""
    from ..e2e import run_end_to_end

    started = time.perf_counter()
    workers = args.workers or max(1, (os.cpu_count() or 2) - 1)
    result = run_end_to_end(args.events, workers, gpus=tuple(args.gpus or (1, 2, 4)),
                            local_gpu=not args.no_local_gpu, progress=progress_printer(started))
    written = write_results(result, args.output, command="coffea-sonic " + " ".join(sys.argv[1:]))
    print_finished("e2e", started, [result["summary"]], written)
    return 0


def markdown(result: dict, machine: str, command: str, date: str) -> str:
    """The end-to-end table of one run, for RESULTS.md."""
    lines = [f"**{machine}**, {date}: `{command}`", "",
             f"{result['events']} events, chunks of {result['chunksize']}, {result['workers']} "
             f"Dask workers, models {', '.join(result['models'])}.", "",
             *table(["inference", "GPUs", "events/s", "vs in-process CPU", "inference share",
                     "GPU busy", "worker memory limit / peak", "scaling model predicts"],
                    map(_cells, result["rows"]), "lrrrrrrr")]
    if result.get("scaling_inputs"):
        inputs = result["scaling_inputs"]
        lines += ["", f"Scaling model from the {inputs['from']}: p = {inputs['p']:.2f}, t_CPU = "
                      f"{1e3 * inputs['t_cpu']:.3f} ms/event, t_GPU = {1e6 * inputs['t_gpu']:.1f} "
                      f"µs/event, t_latency = {1e3 * inputs['t_latency']:.3f} ms/event; "
                      f"{result.get('advice', '')}."]
    return "\n".join(lines) + "\n"


def _cells(row: dict) -> list:
    return [row["inference"], row["gpus"], f"{row['events_per_s']:.0f}", f"{row['speedup']:.2f}×",
            f"{row['inference_share']:.2f}", cell(row.get("gpu_percent"), ".0f", " %"),
            f"{row['worker_memory_bytes'] / 2**30:.1f} / "
            f"{row['worker_peak_rss_bytes'] / 2**30:.2f} GiB",
            cell(row.get("predicted_events_per_s") or None, ".0f")]


def machine_words(info: dict) -> str:
    """The machine in words for a results table: GPUs (count x model), cores."""
    gpus = info.get("gpus") or []
    card = f"{len(gpus)}× {gpus[0].split(',')[0].strip()}" if gpus else "no GPU"
    return f"{card}, {info.get('cpu_cores')} cores"


def write_results(result: dict, output: str, *, command: str) -> dict[str, str]:
    """results.json, results.md and e2e_machine.png (events/s per way of inference) in ``output``."""
    from ..machine import machine_info

    folder = Path(output)
    info = machine_info()
    result = {**result, "machine": info, "command": command}
    write_report(result, folder, "results",
                 lambda report: markdown(report, machine_words(info), command, info["date"][:10]))
    written = {"json": folder / "results.json", "markdown": folder / "results.md"}
    plot = folder / "e2e_machine.png"
    if _plot(result, plot, machine_words(info)):
        written["plot"] = plot
    return {name: str(path) for name, path in written.items()}


def _plot(result: dict, path: Any, title: str) -> bool:
    try:
        plt = pyplot()
    except ImportError:
        return False
    rows = result["rows"]
    figure, axis = plt.subplots(figsize=(7, 4))
    names = [row["inference"] for row in rows]
    axis.bar(names, [row["events_per_s"] for row in rows], color="tab:blue", label="measured")
    predicted = [(name, row["predicted_events_per_s"]) for name, row in zip(names, rows)
                 if row.get("predicted_events_per_s")]
    if predicted:
        axis.scatter([name for name, _ in predicted], [value for _, value in predicted],
                     color="tab:red", marker="_", s=600, label="scaling model")
    axis.set_ylabel("events / s")
    axis.set_title(f"{result['events']} events, {result['workers']} workers; {title}", fontsize=9)
    axis.legend()
    save_figure(figure, path)
    return True
