"""``coffea-sonic bench e2e``: the analysis end to end on this machine, every way to infer.

In-process CPU, in-process GPU in every worker, served on 1, 2, 4 GPUs (those the machine has);
see :mod:`coffea_sonic.bench.e2e_machine`.

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="coffea-sonic bench")
>>> _ = register(parser.add_subparsers())
>>> args = parser.parse_args(["e2e", "--events", "1000", "--workers", "2", "--gpus", "1,2"])
>>> args.events, args.workers, args.gpus, args.output
(1000, 2, [1, 2], 'bench-output/e2e')
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ...cliargs import add_list_option
from . import print_written, progress_printer, scenario_parser


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``e2e`` to the ``bench`` scenarios."""
    parser = scenario_parser(
        subparsers, "e2e", help="the demo analysis end to end: in-process CPU / GPU vs served on 1, 2, 4 GPUs",
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
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """results.json, results.md and e2e_machine.png in ``--output``."""
    from ..e2e_machine import run_machine_e2e, write_results

    started = time.perf_counter()
    workers = args.workers or max(1, (os.cpu_count() or 2) - 1)
    result = run_machine_e2e(args.events, workers, gpus=tuple(args.gpus or (1, 2, 4)),
                             local_gpu=not args.no_local_gpu,
                             progress=progress_printer(started))
    written = write_results(result, args.output, command="coffea-sonic " + " ".join(sys.argv[1:]))
    print(f"bench e2e finished in {time.perf_counter() - started:.0f} s")
    print(result["summary"])
    print_written(written)
    return 0
