"""``coffea-sonic bench agc``: the Analysis Grand Challenge's ML step, local and served.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse

from ...cliargs import add_list_option
from . import add_numbers, scenario_parser

_DESCRIPTION = """\
Scores a chunk of AGC-like events (12, 60 or 180 jet permutations of 20 features each; each event
by the BDT not trained on its parity) with the zoo's reconstruction_bdt_xgb pair four ways: XGBoost
in this process (the AGC's local path), the embedded server's FIL backend through a default
TritonModel (both parities in flight) on each --devices, and the AGC's own client path
(tritonclient gRPC, metadata per chunk, one synchronous call per parity) against the same server.
Every answer is checked against local XGBoost. Prints events/s, events/s per client core (the AGC's
metric) and the ratio to local XGBoost; writes agc.json and agc.md into -o DIR.

examples:
  coffea-sonic bench agc                              # CPU server, 20 000 events per chunk
  coffea-sonic bench agc --model-files tests/data/agc     # the AGC's own 251-tree models
  coffea-sonic bench agc --devices cpu,gpu -o benchmarks/results/gpu-agc   # on a GPU machine
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``agc`` to the ``bench`` scenarios."""
    parser = scenario_parser(subparsers, "agc", description=_DESCRIPTION,
                             help="the AGC's ML step: local XGBoost, served (CPU/GPU), the AGC's "
                                  "own client")
    add_numbers(parser, [("--events", int, 20_000, "events per chunk"),
                         ("--seconds", float, 5.0, "seconds per case"),
                         ("--end-to-end-events", int, 0,
                          "also run the whole AGC analysis (AgcProcessor, one process) on a "
                          "synthetic sample of this many events, served and in-process (0: no)")])
    add_list_option(parser, "--devices", default=["cpu"], choices=["cpu", "gpu"],
                    metavar="DEVICE",
                    help="where the embedded server runs the BDTs (default: cpu; gpu: XGBoost "
                         "on CUDA)")
    parser.add_argument("--model-files", metavar="DIR",
                        help="a folder with the AGC's own model_odd.json (served as version 1) "
                             "and model_even.json (version 2) instead of the zoo's pair")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run every case, write, print the table."""
    from ..agc import AgcBench, run_agc, write_agc

    config = AgcBench(events=args.events, seconds=args.seconds, devices=list(args.devices),
                      model_files=args.model_files, end_to_end_events=args.end_to_end_events)
    print(write_agc(run_agc(config), args.output))
    return 0
