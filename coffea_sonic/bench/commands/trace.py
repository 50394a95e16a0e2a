"""``coffea-sonic bench trace``: where a light user's latency goes in the fairness scenario.

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="coffea-sonic bench")
>>> _ = register(parser.add_subparsers())
>>> args = parser.parse_args(["trace", "-o", "t", "--set", "rows=2048", "heavy_nice=0"])
>>> args.output, _overrides(args.set)
('t', {'rows': 2048, 'heavy_nice': 0})
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import progress_printer, scenario_parser

_DESCRIPTION = """\
Runs the quick fairness scenario (coffea-sonic bench fairness --quick) with Triton's request trace
on and per-process CPU sampling, then splits every light request's latency into to_server (send
until the server has read it), queue, compute, send and back (the answer until the caller has
it), for the solo and the contended phases, and gives cores used / threads waiting per phase and
process group. It takes a small machine's cores for a few minutes: one run at a time.

examples:
  coffea-sonic bench trace -o /tmp/fairness-trace --set rows=2048
  coffea-sonic bench trace --analyse /tmp/fairness-trace     # analyse an earlier run again
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``trace`` to the ``bench`` scenarios."""
    parser = scenario_parser(subparsers, "trace", description=_DESCRIPTION,
                             help="the fairness scenario traced: where a light request's time goes")
    parser.add_argument("--analyse", metavar="DIR",
                        help="only analyse a folder an earlier run wrote (no run)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="FairnessConfig fields (JSON values), e.g. rows=2048 heavy_nice=0")
    parser.set_defaults(func=run)
    return parser


def _overrides(items: list[str]) -> dict:
    return {key: json.loads(value) for key, value in (item.split("=", 1) for item in items)}


def run(args: argparse.Namespace) -> int:
    """Run (unless ``--analyse``), then print the analysis."""
    from ..fairness_trace import analyse, run_traced

    folder = Path(args.analyse or args.output)
    if not args.analyse:
        for line in run_traced(folder, _overrides(args.set), progress_printer()):
            print(line)
    for line in analyse(folder):
        print(line)
    return 0
