"""``coffea-sonic bench window``: request size x requests in flight of TritonModel, per transport.

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="coffea-sonic bench")
>>> _ = register(parser.add_subparsers())
>>> args = parser.parse_args(["window", "--transports", "grpc", "http", "--sizes-mib", "2,4"])
>>> args.transports, args.sizes_mib, args.in_flight, args.output
(['grpc', 'http'], [2.0, 4.0], [2, 4, 8], 'bench-output/window')
"""

from __future__ import annotations

import argparse

from ...cliargs import add_deprecated_alias, add_list_option
from . import add_numbers, scenario_parser

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
    parser = scenario_parser(subparsers, "window", description=_DESCRIPTION,
                             help="request size x requests in flight of one TritonModel")
    add_deprecated_alias(parser, "--out", parser._option_string_actions["--output"])
    add_list_option(parser, "--transports", choices=("grpc", "shm", "http"), default=["grpc"],
                    help="default: grpc")
    add_list_option(parser, "--sizes-mib", type=float, default=[1.0, 2.0, 4.0, 8.0],
                    help="max_request_bytes values in MiB (default: 1 2 4 8)")
    add_list_option(parser, "--in-flight", type=int, default=[2, 4, 8],
                    help="max_in_flight values (default: 2 4 8)")
    add_numbers(parser, [("--rows", int, 200_000, "rows per call"),
                         ("--window-s", float, 3.0, "seconds per window"),
                         ("--rounds", int, 3, "windows per configuration")])
    add_deprecated_alias(parser, "--window", parser._option_string_actions["--window-s"])
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Sweep, write, print the table."""
    from ..window_sweep import WindowSweep, run_sweep, write_sweep

    config = WindowSweep(transports=args.transports, sizes_mib=args.sizes_mib,
                         in_flight=args.in_flight, rows=args.rows, window=args.window_s,
                         rounds=args.rounds)
    print(write_sweep(run_sweep(config), args.output))
    return 0
