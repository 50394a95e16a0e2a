"""``coffea-sonic bench outage``: a 16-chunk Dask run whose server dies, against a healthy run.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse

from . import add_numbers, scenario_parser

_DESCRIPTION = """\
Runs the example analysis (jet_tagger, particlenet_lite) under processor.Runner with a Dask
LocalCluster of 2 workers over 16 chunks, with fallback='cpu', three times: the server healthy,
the server SIGKILLed once 3 chunks are done, and no server at all. Writes outage.json and
outage.png into -o DIR; the goal is the killed run within twice the healthy run plus the connect
timeout (10 s).

examples:
  coffea-sonic bench outage                          # 16 000 events per dataset (about a minute)
  coffea-sonic bench outage --events 4000 -o /tmp/outage
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``outage`` to the ``bench`` scenarios."""
    parser = scenario_parser(subparsers, "outage", description=_DESCRIPTION,
                             help="a run whose server dies mid-run (fallback='cpu') vs a healthy run")
    add_numbers(parser, [("--events", int, 16000,
                          "events per dataset (2 datasets x 2 files, 16 chunks)")])
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Measure and print the three runs and the goal."""
    from ..outage import measure

    record = measure(args.events, args.output, progress=print)
    print(f"killed / healthy = {record['killed_over_healthy']}x; goal <= {record['goal_s']} s: "
          f"{'met' if record['goal_met'] else 'NOT met'}; written to {args.output}/outage.json")
    return 0
