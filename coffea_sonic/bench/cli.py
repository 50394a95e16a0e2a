"""``coffea-sonic bench``: measure in-process vs served inference on this machine, one command.

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="coffea-sonic")
>>> add_subparsers(parser.add_subparsers())
>>> args = parser.parse_args(["bench", "--quick", "--models", "jet_tagger"])
>>> config_from_args(args).preset, config_from_args(args).models
('quick', ('jet_tagger',))
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from .. import zoo
from ..errors import ConfigurationError
from .config import MODES, PRESETS

logger = logging.getLogger(__name__)

DEFAULT_OUTPUT_DIR = "bench-output"

EXAMPLES = """\
examples:
  coffea-sonic bench --quick
      all modes on jet_tagger with the embedded server, and the demo analysis end to end
      (8000 events, 1 and 2 Dask workers); about a minute on 2 cores
  coffea-sonic bench
      full preset: jet_tagger and emtrk_cnn, batch / in-flight / clients sweeps
  coffea-sonic bench --server triton+grpc://gpu-node:8001 --clients 1 4 16 64
      against your facility's server (it must serve the zoo models: coffea-sonic serve)
  coffea-sonic bench --preset gpu --device gpu
      the H100 sweeps of benchmarks/RESULTS.md (local-gpu mode needs torch with CUDA)
  coffea-sonic bench --quick --e2e-events 20000 --e2e-workers 1 2 4
      a bigger end-to-end run (CPU inference vs served); --e2e-events 0 skips it
  coffea-sonic bench --report-from bench-output/results.partial.json -o report
      tables, targets, fit and plots from what a stopped run measured
  coffea-sonic bench --models emtrk_cnn --modes cpu remote --batch-sizes 64 256 --chunk-rows 1024
  coffea-sonic bench --scenario e2e --e2e-events 1000000 --e2e-workers 15 -o e2e
      the analysis end to end on a GPU machine (1 M events, 15 Dask workers): in-process CPU,
      in-process GPU in every worker, served on 1, 2, 4 GPUs (those the machine has)
  coffea-sonic bench --scenario fairness --quick -o fairness
      8 users (processes) share one server, one with 10x the load: Jain's index of goodput
      while all saturate, light users' p95 latency beside the heavy one / alone (under 1 min)

outputs (in --output, default bench-output/): results.json (machine, versions, config, raw
samples, equality, targets, scaling fit), results.md (tables), throughput_vs_batch.png,
throughput_vs_clients.png (measured vs the fitted SONIC model), throughput_vs_in_flight.png,
e2e_speedup.png.
"""


def _rows_per_event(text: str) -> tuple[str, float]:
    try:
        model, value = text.split("=", 1)
        return model, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MODEL=ROWS, e.g. emtrk_cnn=2048, not {text!r}")


def add_subparsers(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench`` on the top-level CLI."""
    bench = subparsers.add_parser(
        "bench", help="benchmark CPU vs local GPU vs served (ours and coffea's wrapper) inference",
        description=(
            "Measure rows/s, events/s, latency percentiles, bytes, server queue vs compute time, "
            "GPU utilisation and client memory for every inference mode on the same data, check "
            "that all modes return the same outputs, fit the SONIC scaling model to the "
            "concurrent-clients sweep, and write JSON, markdown and PNG plots.\n\n"
            f"modes: {', '.join(MODES)} (local-gpu only where torch sees a GPU)\n\n" + EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("--scenario", choices=("suite", "fairness", "e2e"), default="suite",
                       help="suite: the measurements above (default); fairness: several users "
                            "share one server (coffea_sonic.bench.fairness); e2e: the analysis "
                            "end to end on this machine, in-process CPU vs in-process GPU vs "
                            "served on 1, 2, 4 GPUs (coffea_sonic.bench.e2e_machine)")
    bench.add_argument("--policy", choices=("fair", "fifo"), default=None,
                       help="fairness scenario: priorities by depth (fair, default) or none")
    bench.add_argument("--quick", action="store_true",
                       help="small sweeps (same as --preset quick)")
    bench.add_argument("--preset", choices=sorted(PRESETS), default=None,
                       help="sweep sizes to start from (default: full, or quick with --quick)")
    bench.add_argument("--models", nargs="+", choices=zoo.names(), metavar="MODEL",
                       help=f"zoo models ({', '.join(zoo.names())})")
    bench.add_argument("--modes", nargs="+", choices=MODES, metavar="MODE",
                       help="modes to run (default: all)")
    bench.add_argument("--batch-sizes", nargs="+", type=int, metavar="N",
                       help="rows per request to sweep (every model)")
    bench.add_argument("--no-default-batch", action="store_true",
                       help="skip each mode's own default batching in the batch sweep")
    bench.add_argument("--in-flight", nargs="+", type=int, metavar="N",
                       help="requests in flight to sweep (remote mode)")
    bench.add_argument("--clients", nargs="+", type=int, metavar="N",
                       help="concurrent client processes to sweep")
    bench.add_argument("--client-modes", nargs="+", choices=MODES, metavar="MODE",
                       help="modes that get the clients sweep (default: remote)")
    bench.add_argument("--chunk-rows", type=int, metavar="N",
                       help="rows per chunk (one client call; every model)")
    bench.add_argument("--repetitions", type=int, metavar="N", help="timed chunks per configuration")
    bench.add_argument("--warmup", type=int, metavar="N", help="untimed chunks first")
    bench.add_argument("--rows-per-event", type=_rows_per_event, action="append", metavar="MODEL=N",
                       help="model rows per event, to convert rows/s into events/s")
    bench.add_argument("--server", metavar="URL",
                       help="existing Triton server: host:port or triton+grpc://host:port "
                            "(default: start the embedded one)")
    bench.add_argument("--device", choices=("auto", "cpu", "gpu"), default=None,
                       help="device of the embedded server (default auto: GPU if present)")
    bench.add_argument("--instances", type=int, metavar="N",
                       help="model instances of the embedded server")
    bench.add_argument("--link-gbps", nargs="+", type=float, metavar="GBPS",
                       help="link speeds for the network bound of the scaling model")
    bench.add_argument("--e2e-events", type=int, metavar="N",
                       help="also run the demo analysis end to end over N events (0: skip)")
    bench.add_argument("--e2e-workers", nargs="+", type=int, metavar="W",
                       help="Dask worker counts of the end-to-end run")
    bench.add_argument("--e2e-gpus", nargs="+", type=int, metavar="K",
                       help="e2e scenario: serve on the first K GPUs, one run per K that this "
                            "machine has (default: 1 2 4)")
    bench.add_argument("--no-local-gpu", action="store_true",
                       help="e2e scenario: leave out the in-process GPU run")
    bench.add_argument("--report-from", metavar="JSON",
                       help="re-derive targets / scaling fit and rewrite markdown and plots from an "
                            "earlier results.json (or a results.partial.json left by a stopped "
                            "run) without measuring")
    bench.add_argument("--output", "-o", default=DEFAULT_OUTPUT_DIR, metavar="DIR",
                       help=f"where to write results (default: {DEFAULT_OUTPUT_DIR}/)")
    bench.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    """The :class:`BenchConfig` the command line asks for."""
    preset = args.preset or ("quick" if args.quick else "full")
    if args.quick and args.preset and args.preset != "quick":
        raise ConfigurationError(f"--quick contradicts --preset {args.preset}; give one of them")
    overrides: dict = {}
    simple = {"models": "models", "modes": "modes", "in_flight": "in_flight",
              "clients": "clients", "client_modes": "client_modes", "chunk_rows": "chunk_rows",
              "repetitions": "repetitions", "warmup": "warmup", "server": "server",
              "device": "device", "instances": "server_instances", "link_gbps": "link_gbps",
              "e2e_events": "e2e_events", "e2e_workers": "e2e_workers"}
    for attribute, field in simple.items():
        value = getattr(args, attribute, None)
        if value is not None:
            overrides[field] = tuple(value) if isinstance(value, list) else value
    if args.batch_sizes:
        overrides["batch_sizes"] = tuple(args.batch_sizes)
        overrides["batch_sizes_per_model"] = {}
        overrides["reference_batch_per_model"] = {}
    if args.chunk_rows:
        overrides["chunk_rows_per_model"] = {}
    if args.no_default_batch:
        overrides["include_default_batch"] = False
    config = PRESETS[preset](**overrides)
    if args.rows_per_event:
        config.rows_per_event.update(dict(args.rows_per_event))
    return config


def advice_lines(results: dict) -> list[str]:
    """The CPU:GPU advice of the SONIC scaling model fitted to the clients sweep (per model) and
    to the end-to-end analysis, as printed after a run.

    >>> fit = {"model": {"recommended_cpu_per_gpu": 6, "saturation_clients": 6.2},
    ...        "recommendation": "give it about 6 such clients"}
    >>> advice_lines({"scaling": {"jet_tagger": fit}})
    ['  CPU:GPU advice, jet_tagger (fitted SONIC model): 6:1 (saturates at 6.2 clients); give it about 6 such clients']
    """
    lines = []
    for name, fit in sorted((results.get("scaling") or {}).items()):
        if name == "analysis":
            continue
        model = fit.get("model", {})
        lines.append(f"  CPU:GPU advice, {name} (fitted SONIC model): "
                     f"{model.get('recommended_cpu_per_gpu')}:1 (saturates at "
                     f"{model.get('saturation_clients', float('nan')):.1f} clients); "
                     f"{fit.get('recommendation', '')}")
    analysis = (results.get("scaling") or {}).get("analysis")
    if analysis:
        lines.append(f"  CPU:GPU advice, the demo analysis: {analysis['summary']}")
    return lines


def run_fairness_scenario(args: argparse.Namespace) -> int:
    """``--scenario fairness``: results.json in ``--output``; exit 1 if a goal is missed."""
    from .fairness import config_for, run_fairness, summary_lines, write_results

    started = time.perf_counter()
    config = config_for("quick" if args.quick else "full", policy=args.policy)
    results = run_fairness(config, progress=lambda message: print(
        f"[{time.perf_counter() - started:6.1f} s] {message}", file=sys.stderr, flush=True))
    path = write_results(results, args.output)
    print(f"fairness ({config.preset}, policy {config.policy}) finished in "
          f"{time.perf_counter() - started:.0f} s")
    for line in summary_lines(results):
        print(line)
    print(f"  results: {path}")
    return 0 if results["fairness"]["met"] else 1


def run_e2e_scenario(args: argparse.Namespace) -> int:
    """``--scenario e2e``: results.json, results.md and e2e_machine.png in ``--output``."""
    import os

    from .e2e_machine import run_machine_e2e, write_results

    started = time.perf_counter()
    workers = (args.e2e_workers or [max(1, (os.cpu_count() or 2) - 1)])[0]
    result = run_machine_e2e(
        args.e2e_events or 1_000_000, workers, gpus=tuple(args.e2e_gpus or (1, 2, 4)),
        local_gpu=not args.no_local_gpu, progress=lambda message: print(
            f"[{time.perf_counter() - started:6.1f} s] {message}", file=sys.stderr, flush=True))
    written = write_results(result, args.output, command="coffea-sonic " + " ".join(sys.argv[1:]))
    print(f"e2e finished in {time.perf_counter() - started:.0f} s")
    print(result["summary"])
    for name, path in written.items():
        print(f"  {name}: {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    if getattr(args, "scenario", "suite") == "fairness":
        return run_fairness_scenario(args)
    if getattr(args, "scenario", "suite") == "e2e":
        return run_e2e_scenario(args)
    from .report import write_outputs
    from .suite import run_bench

    if args.report_from:
        import json

        from .suite import finish_results

        with open(args.report_from) as handle:
            results = finish_results(json.load(handle))
        written = write_outputs(results, args.output)
        for name, path in written.items():
            print(f"  {name}: {path}")
        return 0
    config = config_from_args(args)
    started = time.perf_counter()

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {message}", file=sys.stderr, flush=True)

    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    checkpoint = output / "results.partial.json"
    results = run_bench(config, progress=progress, checkpoint=str(checkpoint))
    written = write_outputs(results, output)
    checkpoint.unlink(missing_ok=True)
    print(f"bench ({config.preset}) finished in {time.perf_counter() - started:.0f} s")
    for target in results["targets"]:
        measured = "–" if target["measured"] is None else f"{target['measured']:.2f}"
        verdict = {True: "met", False: "MISSED", None: "info"}[target["met"]]
        print(f"  {target['model']:>16}  {target['name']}: {measured} ({verdict})")
    equality = results["equality"]
    print(f"  outputs equal across modes (worst max |diff| {equality['worst']:.1e}; tolerance "
          f"{equality['tolerance']:g}, {equality['gpu_tolerance']:g} on GPU): "
          f"{'yes' if equality['all_equal'] else 'NO'}")
    for line in advice_lines(results):
        print(line)
    for skipped in results["skipped"]:
        print(f"  skipped: {skipped}")
    for name, path in written.items():
        print(f"  {name}: {path}")
    return 0 if equality["all_equal"] else 1
