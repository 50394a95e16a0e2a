"""``coffea-sonic bench fairness``: several users share one server; is it fair?

8 user processes (quick preset), one with 10x the load: Jain's index of goodput while all
saturate, light users' p95 latency beside the heavy one / alone (:mod:`coffea_sonic.bench.fairness`).

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="coffea-sonic bench")
>>> _ = register(parser.add_subparsers())
>>> args = parser.parse_args(["fairness", "--quick", "--policy", "fifo"])
>>> args.quick, args.policy, args.output
(True, 'fifo', 'bench-output/fairness')
"""

from __future__ import annotations

import argparse
import time

from . import progress_printer, scenario_parser


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``fairness`` to the ``bench`` scenarios."""
    parser = scenario_parser(
        subparsers, "fairness", help="several users share one server: goodput fairness and latency",
        description=(
            "8 users (processes) share one embedded server, one with 10x the load: Jain's index "
            "of goodput while all saturate, and the light users' p95 latency beside the heavy "
            "one vs alone. Exit code 1 if a goal is missed.\n\n"
            "example:\n  coffea-sonic bench fairness --quick -o fairness   # under a minute"))
    parser.add_argument("--quick", action="store_true", help="the quick preset (default: full)")
    parser.add_argument("--policy", choices=("fair", "fifo", "gateway"), default=None,
                        help="priorities by depth (fair, default), none (fifo), or a quota per "
                             "user at the HAProxy gateway (gateway: no priorities, no yield gate)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """results.json in ``--output``; exit 1 if a fairness goal is missed."""
    from ..fairness import config_for, run_fairness, summary_lines, write_results

    started = time.perf_counter()
    config = config_for("quick" if args.quick else "full", policy=args.policy)
    results = run_fairness(config, progress=progress_printer(started))
    path = write_results(results, args.output)
    print(f"bench fairness ({config.preset}, policy {config.policy}) finished in "
          f"{time.perf_counter() - started:.0f} s")
    for line in summary_lines(results):
        print(line)
    print(f"  results: {path}")
    return 0 if results["fairness"]["met"] else 1
