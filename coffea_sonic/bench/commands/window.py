"""``coffea-sonic bench window``: request size x requests in flight of TritonModel, per transport.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import itertools
import statistics

from ...cliargs import add_list_option
from ..files import table
from ..machine import load_lines, machine_title
from . import add_numbers, old_spellings, scenario_parser

__all__ = ["markdown", "register", "run"]

_DESCRIPTION = """\
One client process calls the transport-bound passthrough model (x: 16 floats -> y: 2) on an
embedded CPU server back to back, for every transport x request size x requests in flight; each
configuration gets one --window-s per round and the rounds alternate through all of them (a machine
others load shifts all alike). Writes window-sweep.json and window-sweep.md (best and median
window per configuration) into -o DIR.

examples:
  coffea-sonic bench window --transports grpc http -o benchmarks/results/cpu2-window
  coffea-sonic bench window --sizes-mib 2 --in-flight 4 --rounds 1 --window-s 1 # a quick look
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``window`` to the ``bench`` scenarios."""
    parser = scenario_parser(subparsers, "window", run=run, description=_DESCRIPTION,
                             help="request size x requests in flight of one TritonModel")
    add_list_option(parser, "--transports", choices=("grpc", "shm", "http"), default=["grpc"],
                    help="default: grpc")
    add_list_option(parser, "--sizes-mib", type=float, default=[1.0, 2.0, 4.0, 8.0],
                    help="max_request_bytes values in MiB (default: 1 2 4 8)")
    add_list_option(parser, "--in-flight", type=int, default=[2, 4, 8],
                    help="max_in_flight values (default: 2 4 8)")
    add_numbers(parser, [("--rows", int, 200_000, "rows per call"),
                         ("--window-s", float, 3.0, "seconds per window"),
                         ("--rounds", int, 3, "windows per configuration")])
    return old_spellings(parser, "--out", "--window")


def _sweep(args: argparse.Namespace) -> dict:
    from ..clients import ClientPool
    from ..machine import stamped
    from ..passthrough import PASSTHROUGH
    from ..reference import _served, tritonmodel_task

    pool = ClientPool(1, tritonmodel_task)
    try:
        with stamped(rows=args.rows, window_s=args.window_s, windows={}) as report, \
                _served(PASSTHROUGH, None, "cpu") as (grpc_address, http_address):
            for _, transport, size, flight in itertools.product(
                    range(args.rounds), args.transports, args.sizes_mib, args.in_flight):
                scheme = "http" if transport == "http" else "grpc"
                address = http_address if scheme == "http" else grpc_address
                task = {"url": f"triton+{scheme}://{address}/{PASSTHROUGH}",
                        "transport": transport, "rows": args.rows, "model": PASSTHROUGH,
                        "duration": args.window_s,
                        "options": {"max_request_bytes": int(size * (1 << 20)),
                                    "max_in_flight": flight}}
                _, (result,) = pool.run(task, 1)
                key = f"{transport} {size:g} MiB x {flight}"
                report["windows"].setdefault(key, []).append(result.get("rows_per_s", 0.0))
                print(key, result, flush=True)
    finally:
        pool.close()
    return report


def markdown(report: dict) -> str:
    """The table: each configuration's best and median window, with machine, load and command."""
    lines = [f"# passthrough, {report['rows']}-row calls, one process "
             f"({machine_title(report['machine'])})", "",
             *load_lines(report),
             *table(["transport, request size x in flight", "best M rows/s", "median M rows/s"],
                    ([key, f"{max(windows) / 1e6:.2f}", f"{statistics.median(windows) / 1e6:.2f}"]
                     for key, windows in report["windows"].items()))]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Sweep, write window-sweep.json and .md, print the table."""
    from ..files import write_report

    print(write_report(_sweep(args), args.output, "window-sweep", markdown))
    return 0
