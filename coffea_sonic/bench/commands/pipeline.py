"""``coffea-sonic bench pipeline``: the trackgnn pipeline, in-process vs served fused vs ensemble.

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="coffea-sonic bench")
>>> _ = register(parser.add_subparsers())
>>> args = parser.parse_args(["pipeline", "--device", "cpu", "--clients", "1,8", "-o", "pb"])
>>> args.device, args.clients, args.modes, args.output
('cpu', [1, 8], ['direct', 'fused', 'ensemble'], 'pb')
>>> parser.parse_args(["pipeline", "--server-arg=--log-verbose=1", "--transport", "grpc"]).server_args
['--log-verbose=1']
"""

from __future__ import annotations

import argparse

from ...cliargs import add_deprecated_alias, add_device_option, add_list_option, resolve_device
from ...errors import ConfigurationError
from . import add_numbers, scenario_parser

_MODES = ("direct", "fused", "ensemble")
_DESCRIPTION = """\
events/s of the trackgnn pipeline (hits -> track labels) in each client process (direct), served
as one fused model (fused) and served as a Triton ensemble of its stages (ensemble), with every
--clients count of client processes starting together. Served labels are checked against the
direct ones first; the direct call's time per stage, the server's queue/compute split and the
GPU's busy share are recorded. Direct runs again after the served ones, and each served rate is
compared with the mean of both direct runs (the direct rate moves between runs); with --rounds N
the modes alternate in N shorter windows instead and are compared over the same rounds. Writes
pipeline-DEVICE.json and pipeline-DEVICE.md into -o DIR. Exit code 1 if a run failed.

examples:
  coffea-sonic bench pipeline --device gpu --clients 1 8          # GPU machine (~1 min)
  coffea-sonic bench pipeline --device gpu --clients 1 --rounds 6  # modes alternating
  coffea-sonic bench pipeline --device cpu --clients 1 --events 20 --duration-s 1 -o /tmp/pb
  coffea-sonic bench pipeline --server host:8001 --modes fused ensemble   # a running server
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``pipeline`` to the ``bench`` scenarios."""
    parser = scenario_parser(subparsers, "pipeline", description=_DESCRIPTION,
                             help="the trackgnn pipeline: in-process vs served fused vs ensemble")
    add_deprecated_alias(parser, "--out", parser._option_string_actions["--output"])
    add_device_option(parser, default="gpu",
                      help="where the pipeline runs, in the clients and on the server (auto: a "
                           "GPU if nvidia-smi sees one; default: %(default)s)")
    add_list_option(parser, "--clients", type=int, default=[1, 8],
                    help="client process counts, one run each (default: 1 8)")
    add_list_option(parser, "--modes", choices=_MODES, default=list(_MODES),
                    help="default: all of " + ", ".join(_MODES))
    add_numbers(parser, [
        ("--events", int, 200, "events per call (chunk)"),
        ("--duration-s", float, 6.0, "seconds per mode and client count (over all rounds)"),
        ("--rounds", int, 1, "run the modes in this many alternating rounds, each "
                             "duration-s/rounds s; ratios compare the same rounds (1: each mode "
                             "once, direct again at the end)"),
        ("--gpu", int, 0, "--device gpu: the one GPU the server and the direct runs use"),
        ("--instances", int, None, "model instances per GPU (None: LocalTritonServer's)")])
    add_deprecated_alias(parser, "--duration", parser._option_string_actions["--duration-s"])
    parser.add_argument("--handoff", choices=("host", "device"), default=None,
                        help="how the ensemble's stages pass tensors to each other: as numpy "
                             "through the host, or as DLPack tensors where they lie (default: "
                             "device on a GPU, host on a CPU)")
    parser.add_argument("--transport", choices=("auto", "grpc", "shm", "cuda", "http"),
                        default="auto",
                        help="how the served modes' clients reach the server (default: "
                             "%(default)s, as TritonModel; grpc is what a worker on another "
                             "host gets)")
    parser.add_argument("--server-arg", dest="server_args", action="append", default=[],
                        metavar="FLAG",
                        help="a tritonserver flag for the server the bench starts; repeat for "
                             "more, e.g. --server-arg=--cuda-memory-pool-byte-size=0:1073741824")
    parser.add_argument("--server", default=None, metavar="HOST:PORT",
                        help="use this running server's gRPC address (serving trackgnn and "
                             "trackgnn_ensemble) instead of starting one")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run every mode x client count; print the table; exit 1 if a run failed."""
    from ..pipeline import PipelineConfig, run_pipeline

    if args.server and args.server_args:
        raise ConfigurationError(
            f"--server-arg {' '.join(args.server_args)} is for the server the bench starts; with "
            f"--server {args.server} it starts none: pass the flags to that server instead")
    if args.rounds < 1:
        raise ConfigurationError(f"--rounds must be 1 or more, not {args.rounds}")
    config = PipelineConfig(device=resolve_device(args.device), clients=args.clients, modes=args.modes,
                            events=args.events, duration=args.duration_s, gpu=args.gpu,
                            instances=args.instances, server=args.server,
                            handoff=args.handoff, transport=args.transport,
                            server_args=args.server_args, rounds=args.rounds)
    report, text = run_pipeline(config, args.output)
    print(text, flush=True)
    return 1 if any("error" in record for record in report["records"]) else 0
