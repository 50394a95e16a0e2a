"""``coffea-sonic bench wrapper``: TritonModel against coffea's ``triton_wrapper``, transport-bound.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse

from ...cliargs import add_list_option
from . import add_numbers, old_spellings, scenario_parser

_DESCRIPTION = """\
The transport-bound slice16 model (python backend: 16 FP32 per row in, the first 2 back) on an
embedded CPU server, one server per --max-batch-size. coffea's triton_wrapper (numpy_call, one
padded request at a time) and TritonModel over grpc, shm, auto (the default) and http take turns
call by call, --rows rows per call. Then Triton's time per call, one request in flight, the
client-side encoding steps of one 4 MiB request and a max_request_bytes x max_in_flight sweep on
the largest max_batch_size. Writes results.json, results.md and wrapper_vs_tritonmodel.png into
-o DIR.

examples:
  coffea-sonic bench wrapper -o benchmarks/results/cpu2-transport --sweep-rounds 0
  coffea-sonic bench wrapper --max-batch-size 65536 --rounds 3 --sweep-rounds 0   # a quick look
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``wrapper`` to the ``bench`` scenarios."""
    parser = scenario_parser(subparsers, "wrapper", run=run, description=_DESCRIPTION,
                             help="TritonModel vs coffea's triton_wrapper, transport-bound")
    add_list_option(parser, "--max-batch-size", type=int, default=[65536, 262144],
                    help="the model's max_batch_size, one server each (default: 65536 262144)")
    parser.add_argument("--no-dynamic-batching", action="store_true",
                        help="no dynamic_batching block in the model config")
    add_numbers(parser, [("--rows", int, 200_000, "rows per call"),
                         ("--rounds", int, 40, "timed calls per client"),
                         ("--sweep-rounds", int, 12, "calls per sweep configuration; 0 skips it")])
    add_list_option(parser, "--sweep-mib", type=float, default=[1.0, 2.0, 4.0, 8.0, 16.0],
                    help="max_request_bytes of the sweep, MiB (default: 1 2 4 8 16)")
    add_list_option(parser, "--sweep-in-flight", type=int, default=[1, 2, 4, 8],
                    help="max_in_flight of the sweep (default: 1 2 4 8)")
    return old_spellings(parser, "--out")


def run(args: argparse.Namespace) -> int:
    """Measure, write, print the tables."""
    from ..wrapper import WrapperBench, run_wrapper
    from ..wrapper_report import write_wrapper

    config = WrapperBench(max_batch_sizes=args.max_batch_size,
                          dynamic_batching=not args.no_dynamic_batching, rows=args.rows,
                          rounds=args.rounds, sweep_rounds=args.sweep_rounds,
                          sweep_mib=args.sweep_mib, sweep_in_flight=args.sweep_in_flight)
    print(write_wrapper(run_wrapper(config), args.output))
    return 0
