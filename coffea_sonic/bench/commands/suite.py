"""``coffea-sonic bench suite``: every inference mode on the same data, sweeps, scaling fit.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ... import zoo
from ...cliargs import add_list_option, add_server_options
from ...errors import ConfigurationError
from ..config import MODES, PRESETS
from . import print_finished, progress_printer, scenario_parser

EXAMPLES = """\
examples:
  coffea-sonic bench suite --quick
      all modes on jet_tagger with the embedded server, and the demo analysis end to end
      (8000 events per dataset, 1 and 2 Dask workers); about a minute on 2 cores
  coffea-sonic bench suite
      full preset: jet_tagger and emtrk_cnn, batch / in-flight / clients sweeps
  coffea-sonic bench suite --server triton+grpc://gpu-node:8001 --clients 1 4 16 64
      against your facility's server (it must serve the zoo models: coffea-sonic serve)
  coffea-sonic bench suite --preset gpu --device gpu
      the H100 sweeps of benchmarks/RESULTS.md (local-gpu mode needs torch with CUDA)
  coffea-sonic bench suite --quick --e2e-events 20000 --e2e-workers 1 2 4
      a bigger end-to-end run (CPU inference vs served); --e2e-events 0 skips it
  coffea-sonic bench suite --models emtrk_cnn --modes cpu,remote --batch-sizes 64 256 --chunk-rows 1024

outputs (in --output, default bench-output/suite/): results.json (machine, versions, config, raw
samples, equality, targets, scaling fit), results.md (tables), throughput_vs_batch.png,
throughput_vs_clients.png (measured vs the fitted SONIC model), throughput_vs_in_flight.png,
e2e_speedup.png; results.partial.json while it runs (bench report re-plots it if stopped).
"""


def _rows_per_event(text: str) -> tuple[str, float]:
    try:
        model, value = text.split("=", 1)
        return model, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MODEL=ROWS, e.g. emtrk_cnn=2048, not {text!r}")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``suite`` to the ``bench`` scenarios."""
    parser = scenario_parser(
        subparsers, "suite", run=run,
        help="CPU vs local GPU vs served (ours and coffea's wrapper): sweeps and fit",
        description=(
            "Measure rows/s, events/s, latency percentiles, bytes, server queue vs compute time, "
            "GPU utilisation and client memory for every inference mode on the same data, check "
            "that all modes return the same outputs, fit the SONIC scaling model to the "
            "concurrent-clients sweep, and write JSON, markdown and PNG plots.\n\n"
            f"modes: {', '.join(MODES)} (local-gpu only where torch sees a GPU)\n\n" + EXAMPLES))
    parser.add_argument("--quick", action="store_true", help="small sweeps (same as --preset quick)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="sweep sizes to start from (default: full, or quick with --quick)")
    add_list_option(parser, "--models", choices=zoo.names(), metavar="MODEL",
                    help=f"zoo models ({', '.join(zoo.names())})")
    add_list_option(parser, "--modes", choices=MODES, metavar="MODE", help="modes to run (default: all)")
    add_list_option(parser, "--batch-sizes", type=int, help="rows per request to sweep (every model)")
    parser.add_argument("--no-default-batch", action="store_true",
                        help="skip each mode's own default batching in the batch sweep")
    add_list_option(parser, "--in-flight", type=int, help="requests in flight to sweep (remote mode)")
    add_list_option(parser, "--clients", type=int, help="concurrent client processes to sweep")
    add_list_option(parser, "--client-modes", choices=MODES, metavar="MODE",
                    help="modes that get the clients sweep (default: remote)")
    parser.add_argument("--chunk-rows", type=int, metavar="N",
                        help="rows per chunk (one client call; every model)")
    parser.add_argument("--repetitions", type=int, metavar="N", help="timed chunks per configuration")
    parser.add_argument("--warmup", type=int, metavar="N", help="untimed chunks first")
    add_list_option(parser, "--rows-per-event", type=_rows_per_event, metavar="MODEL=N",
                    help="model rows per event, to convert rows/s into events/s")
    add_server_options(parser, device_default=None)
    parser.add_argument("--instances", type=int, metavar="N",
                        help="model instances of the embedded server")
    add_list_option(parser, "--link-gbps", type=float, metavar="GBPS",
                    help="link speeds for the network bound of the scaling model")
    parser.add_argument("--e2e-events", type=int, metavar="N",
                        help="also run the demo analysis end to end over N events per dataset "
                             "(0: skip)")
    add_list_option(parser, "--e2e-workers", type=int, metavar="W",
                    help="Dask worker counts of the end-to-end run")
    return parser


_SIMPLE = {"models": "models", "modes": "modes", "in_flight": "in_flight", "clients": "clients",
           "client_modes": "client_modes", "chunk_rows": "chunk_rows",
           "repetitions": "repetitions", "warmup": "warmup", "server": "server",
           "device": "device", "instances": "server_instances", "link_gbps": "link_gbps",
           "e2e_events": "e2e_events", "e2e_workers": "e2e_workers"}


def config_from_args(args: argparse.Namespace):
    """The :class:`~coffea_sonic.bench.config.BenchConfig` the command line asks for."""
    preset = args.preset or ("quick" if args.quick else "full")
    if args.quick and args.preset and args.preset != "quick":
        raise ConfigurationError(f"--quick contradicts --preset {args.preset}; give one of them")
    overrides: dict = {}
    for attribute, field in _SIMPLE.items():
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


def summary_lines(results: dict) -> list[str]:
    """Targets, output equality, advice and skipped parts of a finished run, as printed."""
    lines = []
    for target in results["targets"]:
        measured = "–" if target["measured"] is None else f"{target['measured']:.2f}"
        verdict = {True: "met", False: "MISSED", None: "info"}[target["met"]]
        lines.append(f"  {target['model']:>16}  {target['name']}: {measured} ({verdict})")
    equality = results["equality"]
    lines.append(f"  outputs equal across modes (worst max |diff| {equality['worst']:.1e}; "
                 f"tolerance {equality['tolerance']:g}, {equality['gpu_tolerance']:g} on GPU): "
                 f"{'yes' if equality['all_equal'] else 'NO'}")
    lines += advice_lines(results)
    lines += [f"  skipped: {skipped}" for skipped in results["skipped"]]
    return lines


def run(args: argparse.Namespace) -> int:
    """Run the suite into ``--output``; exit 1 if the modes' outputs differ."""
    from ..report import write_outputs
    from ..suite import run_bench

    config = config_from_args(args)
    started = time.perf_counter()
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    checkpoint = output / "results.partial.json"
    results = run_bench(config, progress=progress_printer(started), checkpoint=str(checkpoint))
    written = write_outputs(results, output)
    checkpoint.unlink(missing_ok=True)
    print_finished(f"suite ({config.preset})", started, summary_lines(results), written)
    return 0 if results["equality"]["all_equal"] else 1
