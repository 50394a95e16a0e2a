"""``coffea-sonic bench soak``: many requests through TritonModel; descriptors and memory stay flat.

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="coffea-sonic bench")
>>> _ = register(parser.add_subparsers())
>>> args = parser.parse_args(["soak", "--servers", "2", "--json-file", "soak.json"])
>>> args.servers, args.transport, args.json_file, args.requests
(2, 'auto', 'soak.json', 10000)
"""

from __future__ import annotations

import argparse
import json

from ...cliargs import add_deprecated_alias
from ..files import write_json
from . import add_numbers, scenario_parser

_DESCRIPTION = """\
Sends --requests requests through TritonModel to embedded tritonservers (jet_tagger) as an
analysis does: pipelined calls, a fresh unpickled model every --chunk calls, a rejected bad input
now and then. Every --report-every requests it samples descriptors, threads, RSS, gRPC channels
and shared-memory regions. Exit code 1 if descriptors or RSS grow past the bounds after the
warm-up sample, or regions beyond the slot pool's. Writes the verdict and samples into
-o DIR/soak.json (and --json-file FILE).

examples:
  coffea-sonic bench soak                         # 10k requests, 1 server (about a minute)
  coffea-sonic bench soak --servers 2 --json-file soak.json
  coffea-sonic bench soak --transport grpc        # tensors in the gRPC message
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``soak`` to the ``bench`` scenarios."""
    parser = scenario_parser(
        subparsers, "soak", description=_DESCRIPTION,
        help="many requests through TritonModel: no growth of descriptors or memory")
    add_numbers(parser, [
            ("--requests", int, 10_000, "requests in all"),
            ("--rows", int, 256, "rows per request"),
            ("--requests-per-call", int, 4, "requests each call is split into"),
            ("--chunk", int, 25, "calls per unpickled model copy"),
            ("--servers", int, 1, "embedded servers, balanced"),
            ("--report-every", int, 1000, "requests between samples"),
            ("--max-fd-growth", int, 8, "open descriptors the run may add after warm-up"),
            ("--max-rss-growth-mb", float, 64.0, "RSS the run may add after warm-up, MB")])
    parser.add_argument("--transport", default="auto", choices=["auto", "grpc", "shm"],
                        help="TritonModel's transport (default: auto: shared memory here)")
    json_file = parser.add_argument("--json-file", metavar="FILE",
                                    help="also write the verdict and samples here")
    add_deprecated_alias(parser, "--json", json_file)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the verdict; exit 1 if a bound was passed."""
    from ..soak import SoakConfig, run_soak

    config = SoakConfig(requests=args.requests, rows=args.rows,
                        requests_per_call=args.requests_per_call, chunk=args.chunk,
                        servers=args.servers, transport=args.transport,
                        report_every=args.report_every, max_fd_growth=args.max_fd_growth,
                        max_rss_growth_mb=args.max_rss_growth_mb)
    verdict, samples = run_soak(config)
    print(json.dumps(verdict, indent=2))
    write_json({"verdict": verdict, "samples": samples}, args.output, "soak.json", args.json_file)
    return 0 if verdict["ok"] else 1
