"""``coffea-sonic bench fairness``: several users share one server; is it fair?
(:mod:`coffea_sonic.bench.fairness`)
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..files import write_json
from . import print_finished, progress_printer, scenario_parser


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``fairness`` to the ``bench`` scenarios."""
    parser = scenario_parser(
        subparsers, "fairness", run=run,
        help="several users share one server: goodput fairness and latency",
        description=(
            "8 users (processes) share one embedded server, one with 10x the load: Jain's index "
            "of goodput while all saturate, and the light users' p95 latency beside the heavy "
            "one vs alone. Exit code 1 if a goal is missed.\n\n"
            "example:\n  coffea-sonic bench fairness --quick -o fairness   # under a minute"))
    parser.add_argument("--quick", action="store_true", help="the quick preset (default: full)")
    parser.add_argument("--policy", choices=("fair", "fifo", "gateway"), default=None,
                        help="priorities by depth (fair, default), none (fifo), or a quota per "
                             "user at the HAProxy gateway (gateway: no priorities, no yield gate)")
    return parser


def summary_lines(results: dict[str, Any]) -> list[str]:
    """What the command prints: the figures against their goals, and the goodput shares."""
    figures, config = results["fairness"], results["config"]
    lines = [f"  {name}: {figures[name]:.3f} (goal {goal['goal']}: "
             f"{'met' if goal['met'] else 'MISSED'})" for name, goal in figures["goals"].items()]
    rounds = ", ".join(f"{ratio:.2f}" for ratio in figures["light_p95_ratio_by_round"])
    return lines + [
        f"  light p95 {figures['light_p95_ms_solo']:.1f} ms alone, "
        f"{figures['light_p95_ms_contended']:.1f} ms beside the heavy user (ratio by round: "
        f"{rounds}); the heavy user sent {figures['heavy_load_contended']:.1f}x a light user's "
        f"load beside them (wants {config['heavy_factor']}x); its share of goodput while all "
        f"saturate {figures['heavy_share_of_goodput']:.1%} (1/{config['users']} is fair)"]


def run(args: argparse.Namespace) -> int:
    """results.json in ``--output``; exit 1 if a fairness goal is missed."""
    from ..fairness import config_for, run_fairness

    started = time.perf_counter()
    config = config_for("quick" if args.quick else "full", policy=args.policy)
    results = run_fairness(config, progress=progress_printer(started))
    print_finished(f"fairness ({config.preset}, policy {config.policy})", started,
                   summary_lines(results))
    write_json(results, args.output, "results.json")
    return 0 if results["fairness"]["met"] else 1
