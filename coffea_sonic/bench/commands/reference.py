"""``coffea-sonic bench reference``: a default TritonModel beside NVIDIA's perf_analyzer
(:mod:`coffea_sonic.bench.reference`).
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse

from ... import zoo
from ...cliargs import add_list_option, add_server_options
from . import old_spellings, scenario_parser


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``reference`` to the ``bench`` scenarios."""
    parser = scenario_parser(
        subparsers, "reference", run=run,
        help="TritonModel at defaults vs NVIDIA's perf_analyzer, per transport",
        description=(
            "For each model and transport: NVIDIA's perf_analyzer (the C++ load generator, "
            "installed on demand) over a batch x concurrency grid, a default TritonModel in one "
            "process calling back to back, alternating on the same server; best rates and ratio."
            "\n\nexamples:\n"
            "  coffea-sonic bench reference                 # passthrough model: grpc, shm, http\n"
            "  coffea-sonic bench reference --models emtrk_cnn --transports grpc cuda --device gpu"
            "\n  coffea-sonic bench reference --server gpu-node:8001,gpu-node:8000 "
            "--transports grpc http"))
    add_list_option(parser, "--models", choices=["passthrough", *zoo.names()],
                    help="passthrough (x: 16 floats -> y: 2, transport-bound; default) and zoo "
                         "models")
    add_list_option(parser, "--transports", choices=("grpc", "shm", "http", "cuda"),
                    help="transports (default: grpc shm http)")
    parser.add_argument("--quick", action="store_true",
                        help="one batch, concurrency 1 and 2, 3 s windows")
    add_list_option(parser, "--batches", type=int,
                    help="perf_analyzer's batch sizes (default per model: passthrough 16384 "
                         "65536, emtrk_cnn 256 2048, jet_tagger 16384 65536)")
    add_list_option(parser, "--concurrency", type=int,
                    help="perf_analyzer's concurrency values (default 1 2 4)")
    parser.add_argument("--window-s", type=float, default=None, metavar="S",
                        help="seconds of each TritonModel window (default 5)")
    add_server_options(parser, metavar="GRPC[,HTTP]", device_default=None,
                       server_help="an existing server serving the models: host:port of gRPC, "
                                   "optionally ,host:port of HTTP")
    return old_spellings(parser, "--window")


def run(args: argparse.Namespace) -> int:
    """Print the table; results.json, results.md and reference.png in ``--output``."""
    from ..reference import run_reference_command

    return run_reference_command(args.models, args.transports, args.quick, args.output,
                                 args.server, args.device, batches=args.batches,
                                 concurrency=args.concurrency, window_s=args.window_s)
