"""``coffea-sonic bench link``: one default TritonModel through a shaped link (network namespaces).
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse

from ...cliargs import add_list_option
from . import add_numbers, old_spellings, scenario_parser

_DESCRIPTION = """\
Needs root (coffea_sonic.netlab: hosts in network namespaces). A lab host behind a tbf-shaped link
serves the transport-bound passthrough model (x: 16 floats -> y: 2); this process calls it with
--rows-row calls, back to back (also at a quarter and twice the size) and two in flight
(infer_async), served by the lab's launcher and by `coffea-sonic serve` as a user starts it, directly or
through the lab's relay adding a round-trip time. Per case: raw TCP's rate on the same path, the
model's payload rate, the link busy fraction and where a back-to-back call's time goes on the wire
(head / sending / tail); gzip and deflate too unless --no-compression, then how much each zoo
model's inputs compress and how fast. Writes link.json and link.md into -o DIR.

examples:
  coffea-sonic bench link --seconds 6 -o benchmarks/results/cpu2-link
  coffea-sonic bench link --links 1000/0 --seconds 1 --no-compression   # a quick look
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``link`` to the ``bench`` scenarios."""
    parser = scenario_parser(subparsers, "link", run=run, description=_DESCRIPTION,
                             help="one TritonModel through a shaped link (root: network "
                                  "namespaces)")
    add_list_option(parser, "--links", default=["1000/0", "1000/20", "10000/0"],
                    metavar="RATE[/RTT]",
                    help="link rate in Mbit/s, each with the round-trip time in ms a relay adds "
                         "(default: 1000/0 1000/20 10000/0)")
    add_list_option(parser, "--servers", default=["lab", "serve"], metavar="SERVER",
                    choices=["lab", "serve"],
                    help="who serves the model on the lab host: the lab's launcher "
                         "(LocalTritonServer) and/or `coffea-sonic serve --repository` as a user "
                         "starts it (default: both)")
    add_numbers(parser, [("--seconds", float, 6.0, "seconds per case"),
                         ("--rows", int, 200_000, "rows per call (16 floats each)")])
    parser.add_argument("--no-compression", action="store_true",
                        help="leave out the gzip/deflate cases and the compressibility table")
    return old_spellings(parser, "--out")


def run(args: argparse.Namespace) -> int:
    """Run every case, write, print the table."""
    from ..link import LinkBench, parse_links, run_link, write_link

    config = LinkBench(links=parse_links(args.links), seconds=args.seconds, rows=args.rows,
                       compression=not args.no_compression, servers=tuple(args.servers))
    print(write_link(run_link(config), args.output))
    return 0
