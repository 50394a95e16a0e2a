"""``coffea-sonic bench transport``: rows/s and GB/s per transport, client processes and server.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse

from ...cliargs import add_device_option, add_list_option
from . import add_numbers, old_spellings, print_written, scenario_parser

_KINDS = ("tritonclient", "grpc", "http", "shm", "cuda", "local")
_PLANS = ("cpu", "gpu", "quick")

_DESCRIPTION = """\
One real tritonserver (embedded; on a GPU machine the one triton-gpu-env.sh points to) serves the
plan's zoo models (python backend) and payload_sink (emtrk_cnn's input, one float back: only the
transport works). Each entry of the plan (transport, model, rows per request, client processes,
requests in flight) gets one --duration-s window: spawned client processes start together and send
back to back; rows/s and input GB/s are counted inside the window, beside Triton's statistics
(queue, compute input / infer / output per request, average batch) and GPU utilisation.
Transports: tritonclient (stock tritonclient.grpc infer, the baseline), grpc, http, shm, cuda (GPU
inputs; GPU only), local (the in-process engine). Writes results-TAG.json, results-TAG.md and
transport-TAG.png into -o DIR (TAG: --tag, default the plan).

examples:
  coffea-sonic bench transport --plan quick --duration-s 1          # a look (under a minute)
  coffea-sonic bench transport --plan cpu -o benchmarks/results/cpu2-transport-bench
  coffea-sonic bench transport --plan gpu --instances 4 --tag h100  # on a GPU machine
  coffea-sonic bench transport --replot results-cpu.json -o figures # table + figure again
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``transport`` to the ``bench`` scenarios."""
    parser = scenario_parser(subparsers, "transport", run=run, description=_DESCRIPTION,
                             help="rows/s and GB/s per transport, client processes and server")
    parser.add_argument("--plan", default="cpu", choices=_PLANS,
                        help="the windows to measure (default: cpu)")
    add_list_option(parser, "--transports", "--only", choices=_KINDS, default=[],
                    help="keep only these transports of the plan (default: all)")
    add_device_option(parser, default=None,
                      help="the server's device (default, auto: a GPU if one is visible)")
    add_numbers(parser, [("--duration-s", float, 4.0, "seconds per window"),
                         ("--instances", int, None,
                          "model instances per device, None: the server's default")])
    parser.add_argument("--staging", default="pinned", choices=["pinned", "pageable"],
                        help="host staging of the GPU model's inputs (default: pinned)")
    parser.add_argument("--gpu-inputs", action="store_true",
                        help="GPU models take their inputs on the GPU (with cuda: no host copy)")
    parser.add_argument("--tag", default=None, help="file name tag (default: the plan)")
    parser.add_argument("--replot", metavar="JSON",
                        help="only write the table and figure of an earlier results-TAG.json")
    return old_spellings(parser, "--out", "--duration")


def run(args: argparse.Namespace) -> int:
    """Measure (or re-draw), write, print the table; exit 1 if a window failed."""
    from ..transport_bench import (TransportBench, markdown, replot, run_transport_bench,
                                   write_transport_report)

    if args.replot:
        print_written(replot(args.replot, args.output))
        return 0
    config = TransportBench(plan=args.plan, kinds=tuple(args.transports),
                            device=None if args.device == "auto" else args.device,
                            duration=args.duration_s, instances=args.instances,
                            staging=args.staging, gpu_inputs=args.gpu_inputs)
    report = run_transport_bench(config)
    print(markdown(report))
    print_written(write_transport_report(report, args.output, args.tag or args.plan))
    return 1 if any(record.get("errors") for record in report["records"]) else 0
