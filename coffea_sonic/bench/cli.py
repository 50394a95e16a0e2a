"""``coffea-sonic bench SCENARIO``: the benchmark scenarios as subcommands.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse

from .commands import register_all

_DESCRIPTION = """\
Benchmarks of this machine (or of your facility's server), one scenario per subcommand. Each
writes results.json (machine, versions, command, raw samples) and, where it makes sense,
results.md and PNG plots into -o/--output DIR (default bench-output/SCENARIO/).

examples:
  coffea-sonic bench suite --quick          # every inference mode, sweeps, scaling fit (~1 min)
  coffea-sonic bench fairness --quick       # 8 users share one server (under 1 min)
  coffea-sonic bench e2e --events 1000000   # the analysis end to end on a GPU node
  coffea-sonic bench report bench-output/suite/results.json -o report
  coffea-sonic bench SCENARIO --help
"""


def add_subparsers(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench`` and its scenarios on the top-level CLI."""
    bench = subparsers.add_parser(
        "bench", help="benchmarks: inference modes, fairness, the analysis end to end, ...",
        description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    scenarios = bench.add_subparsers(dest="scenario", metavar="SCENARIO")
    register_all(scenarios)
    bench.set_defaults(func=_usage(bench))


def _usage(bench: argparse.ArgumentParser):
    def run(args: argparse.Namespace) -> int:
        bench.print_help()
        return 2

    return run
