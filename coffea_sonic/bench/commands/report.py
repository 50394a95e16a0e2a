"""``coffea-sonic bench report``: tables, targets, fit and plots again from a suite's JSON.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import json

from . import print_written, scenario_parser


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``report`` to the ``bench`` scenarios."""
    parser = scenario_parser(
        subparsers, "report", run=run,
        help="re-derive and re-plot a suite's results without measuring",
        description=(
            "Re-derive targets and the scaling fit, and rewrite markdown and plots, from an "
            "earlier results.json of `bench suite` (or the results.partial.json a stopped run "
            "left), without measuring.\n\n"
            "example:\n  coffea-sonic bench report bench-output/suite/results.partial.json -o report"))
    parser.add_argument("results", metavar="JSON", help="results.json or results.partial.json")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..report import write_outputs
    from ..suite import finish_results

    with open(args.results) as handle:
        results = finish_results(json.load(handle))
    print_written(write_outputs(results, args.output))
    return 0
