"""``coffea-sonic bench ragged``: bytes on the wire, ragged requests vs padded tensors.

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="coffea-sonic bench")
>>> _ = register(parser.add_subparsers())
>>> args = parser.parse_args(["ragged", "--events", "2000", "--json-file", "r.json"])
>>> args.events, args.seed, args.json_file, args.output
(2000, 0, 'r.json', 'bench-output/ragged')
"""

from __future__ import annotations

import argparse

from ...cliargs import add_deprecated_alias
from ..files import write_json
from . import add_numbers, scenario_parser

_DESCRIPTION = """\
Writes the synthetic PFNano-like sample, reads its multiplicities back from the ROOT files and
measures what TritonModel sends (in-memory transport, so bytes are counted, not timed) for
per-event PF candidates (ragged vs padded to the sample's and to each request's largest event)
and per-jet ParticleNet constituents (ragged vs particlenet_lite's padded-to-32 tensors).
Writes ragged_bytes.json into -o DIR (and into --json-file FILE when given).

examples:
  coffea-sonic bench ragged                        # 20k events per dataset (about a minute)
  coffea-sonic bench ragged --events 2000 -o /tmp/ragged
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``ragged`` to the ``bench`` scenarios."""
    from ...data.synthetic import DEFAULT_EVENTS_PER_DATASET
    from ...model import TRANSPORT_DEFAULTS

    parser = scenario_parser(subparsers, "ragged", description=_DESCRIPTION,
                             help="bytes on the wire: ragged requests vs padded tensors")
    add_numbers(parser, [
        ("--events", int, DEFAULT_EVENTS_PER_DATASET, "events per dataset, ttbar and qcd_light"),
        ("--seed", int, 0, "the sample's seed"),
        ("--cap", int, TRANSPORT_DEFAULTS["grpc"][0], "max_request_bytes (gRPC's)")])
    json_file = parser.add_argument("--json-file", metavar="FILE",
                                    help="also write the results here")
    add_deprecated_alias(parser, "--json", json_file)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Measure, print the two summary lines, write the JSON."""
    from ..ragged_bytes import measure, summary_lines

    result = measure(args.events, args.seed, args.cap)
    for line in summary_lines(result):
        print(line)
    write_json(result, args.output, "ragged_bytes.json", args.json_file)
    return 0
