"""``coffea-sonic demo``: the main job, end to end on one machine (or your facility).

What each step does and prints, and the options: docs/user/quickstart.md, "The demo"; its
parser's defaults: docs/internals/command-line.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Mapping

from .cliargs import add_deprecated_alias, add_list_option, add_server_options
from .facility.cli import add_batch_options, batch_options

logger = logging.getLogger(__name__)

DEFAULT_OUTPUT = "sonic-demo"
DEFAULT_EVENTS = 20_000
DEFAULT_CHUNKSIZE = 10_000
DEMO_MODELS = ("jet_tagger", "particlenet", "deepmet")
#: Defaults per ``--analysis`` (the tracking pipeline costs ~10 ms of CPU per event).
ANALYSIS_DEFAULTS: dict[str, dict[str, Any]] = {
    "jets": {"events": DEFAULT_EVENTS, "chunksize": DEFAULT_CHUNKSIZE, "output": DEFAULT_OUTPUT},
    "tracking": {"events": 1_000, "chunksize": 500, "output": "sonic-demo-tracking"},
}
#: Events of the first file the tracking demo also runs in-process, to compare labels.
CHECK_EVENTS = 50

_DESCRIPTION = """\
Run the example jet-tagging analysis with inference as a service, end to end: synthetic
NanoAOD-like sample -> embedded real Triton server -> Dask workers running a coffea processor
that sends every chunk's jets to the server -> histograms, plot and summary.
With no arguments everything runs on this machine (20 000 events per dataset, 2 workers: under
5 minutes on 2 cores; 3.7 min on a 2-core box shared with other jobs at load 17-37).

--analysis tracking runs the tracking example instead: every event's tracker hits (the sample's
Hit collection) go unpadded, in ragged requests, to the served trackgnn pipeline (embedding ->
neighbour graph -> edge filter -> GNN -> connected components), which answers a track label per
hit; it prints events, hits, tracks found, track efficiency and purity, and checks the served
labels against an in-process run of the first events (also about a minute on 2 cores)."""

_EPILOG = """\
examples:
  coffea-sonic demo                                   # everything local, default sizes
  coffea-sonic demo --events 200000 --workers 4       # bigger sample, more workers
  coffea-sonic demo --server triton+grpc://gpu1.example.org:8001   # your facility's server
  coffea-sonic demo --scheduler tcp://10.0.0.5:8786   # an existing Dask cluster
  coffea-sonic demo --cluster slurm --workers 8       # workers as SLURM jobs (site's jobqueue.yaml)
  coffea-sonic demo --cluster slurm --queue short --walltime 00:30:00 --memory 4GiB
  coffea-sonic demo --files /data/nano/*.root         # your own CMS NanoAOD (Events tree)
  coffea-sonic demo --fileset fileset.json            # {"dataset": ["file.root", ...]}
  coffea-sonic demo --analysis tracking               # track finding as a service
  coffea-sonic demo --analysis tracking --pipeline ensemble --events 5000

outputs (in --output): scores.png (tracking.png with --analysis tracking), summary.json, and
sample/ when the sample is generated."""


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="coffea-sonic demo", description=_DESCRIPTION,
                                               epilog=_EPILOG,
                                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--analysis", choices=tuple(ANALYSIS_DEFAULTS), default="jets",
                        help="jets: jet tagging, deepmet; tracking: track finding with the "
                             "trackgnn pipeline on the sample's hits (default: %(default)s)")
    data = parser.add_argument_group("data")
    data.add_argument("--events", type=int,
                      help=f"synthetic events per dataset (default: {DEFAULT_EVENTS}; "
                           f"{ANALYSIS_DEFAULTS['tracking']['events']} with --analysis tracking)")
    data.add_argument("--sample-files", type=int, default=2,
                      help="synthetic files per dataset (default: %(default)s)")
    add_list_option(data, "--files", split_commas=False, metavar="PATH",
                      help="your own NanoAOD files (local paths or root:// URLs) instead of the sample")
    data.add_argument("--fileset", metavar="JSON", help="a coffea fileset {dataset: [files]} as JSON")
    data.add_argument("--treename", default="Events", help="TTree name (default: %(default)s)")
    serving = parser.add_argument_group("inference")
    add_server_options(serving, server_help="existing Triton server, triton+grpc://host:port")
    serving.add_argument("--max-in-flight", type=int, default=4,
                         help="requests in flight per model and worker (default: %(default)s)")
    cache = serving.add_argument(
        "--inference-cache", metavar="DIR",
        help="persistent inference cache (a directory every worker can reach): a rerun sends "
             "only what no earlier run answered (default: the COFFEA_SONIC_INFERENCE_CACHE "
             "setting, off)")
    add_deprecated_alias(serving, "--cache", cache)
    serving.add_argument("--no-constituents", action="store_true",
                         help="skip the PF-candidate models (particlenet, deepmet)")
    serving.add_argument("--pipeline", choices=("fused", "ensemble"), default="fused",
                         help="--analysis tracking: the fused trackgnn model or the Triton "
                              "ensemble of its stages, trackgnn_ensemble (default: %(default)s)")
    compute = parser.add_argument_group("compute")
    compute.add_argument("--executor", choices=("dask", "futures", "iterative"), default="dask",
                         help="coffea executor (default: %(default)s)")
    compute.add_argument("--workers", type=int, default=2,
                         help="Dask workers / futures processes (default: %(default)s)")
    compute.add_argument("--cluster", default="local", metavar="KIND",
                         help="local | slurm | htcondor | scheduler address (default: %(default)s)")
    compute.add_argument("--scheduler", metavar="ADDRESS",
                         help="connect to an existing Dask scheduler (same as --cluster ADDRESS)")
    compute.add_argument("--chunksize", type=int,
                         help=f"events per chunk (default: {DEFAULT_CHUNKSIZE}; "
                              f"{ANALYSIS_DEFAULTS['tracking']['chunksize']} with --analysis "
                              "tracking)")
    add_batch_options(parser)
    parser.add_argument("-o", "--output", metavar="DIR",
                        help=f"output directory (default: ./{DEFAULT_OUTPUT}; "
                             f"./{ANALYSIS_DEFAULTS['tracking']['output']} with --analysis "
                             "tracking)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def add_subparsers(subparsers: argparse._SubParsersAction) -> None:
    """Register ``demo`` on the top-level CLI."""
    parser = subparsers.add_parser("demo", help="run the example analysis end to end (the main job)",
                                   description=_DESCRIPTION, epilog=_EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    build_parser(parser)
    parser.set_defaults(func=run)


# -- pieces -----------------------------------------------------------------------------------
def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options left unset with the defaults of ``args.analysis``."""
    for name, value in ANALYSIS_DEFAULTS[args.analysis].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    return args


def prepare_fileset(args: argparse.Namespace, output: Path) -> dict[str, list[str]]:
    """The fileset to run on: the user's files, or a (reused) synthetic sample."""
    if args.fileset:
        with open(args.fileset) as handle:
            loaded = json.load(handle)
        return {name: list(files) if not isinstance(files, dict) else list(files.get("files", files))
                for name, files in loaded.items()}
    if args.files:
        return {"user": list(args.files)}
    from .data.synthetic import write_sample

    sample_dir = output / "sample"
    wanted = {"events": args.events, "files": args.sample_files, "seed": 0}
    params_file = sample_dir / "params.json"
    fileset_file = sample_dir / "fileset.json"
    if params_file.exists() and fileset_file.exists() and json.loads(params_file.read_text()) == wanted:
        fileset = json.loads(fileset_file.read_text())
        if all(Path(path).exists() for files in fileset.values() for path in files):
            print(f"reusing the sample in {sample_dir}", flush=True)
            return fileset
    print(f"writing the synthetic sample ({args.events} events per dataset) to {sample_dir}", flush=True)
    fileset = write_sample(sample_dir, events=args.events, files=args.sample_files, seed=0)
    params_file.write_text(json.dumps(wanted))
    return fileset


def _executor(args: argparse.Namespace, stack: ExitStack):
    from coffea import processor

    status = not args.no_progress
    # Each call already retried and failed over inside the client; running the whole chunk again
    # (coffea's default: three more times) only repeats a final error such as a shadow divergence.
    if args.executor == "iterative":
        return processor.IterativeExecutor(status=status, retries=0), 1
    if args.executor == "futures":
        return (processor.FuturesExecutor(workers=args.workers, status=status, retries=0),
                args.workers)
    kind = args.scheduler or args.cluster
    from .facility.cluster import make_cluster

    cluster = stack.enter_context(make_cluster(kind, workers=args.workers, **batch_options(args)))
    print(f"Dask cluster: {cluster!r}", flush=True)
    return (processor.DaskExecutor(client=cluster.client, status=status, retries=0),
            max(cluster.n_workers(), 1))


def _server_statistics(urls: Mapping[str, str]) -> dict[str, Any]:
    from .model import TritonModel

    snapshots = {}
    for name, url in urls.items():
        try:
            snapshots[name] = TritonModel(url).server_statistics()
        except Exception as error:  # statistics are optional (a gateway may hide them)
            logger.info("no server statistics for %s: %s", name, error)
    return snapshots


def summarise(output: Mapping[str, Any], wall_s: float, workers: int,
              server_delta: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers the demo prints and writes to summary.json.

    >>> from coffea_sonic.stats import InferenceStats
    >>> out = {"cutflow": {"d": {"events": 10, "jets": 30}},
    ...        "inference": {"jet_tagger": InferenceStats(rows=30, requests=1, wait_s=0.5)}}
    >>> summary = summarise(out, wall_s=2.0, workers=1, server_delta={})
    >>> summary["events"], summary["events_per_s"], summary["inference_wait_share"]
    (10, 5.0, 0.25)
    """
    events = sum(int(entry["events"]) for entry in output["cutflow"].values())
    jets = sum(int(entry["jets"]) for entry in output["cutflow"].values())
    inference = output.get("inference", {})
    wait_s = sum(stats.wait_s for stats in inference.values())
    return {
        "events": events,
        "jets": jets,
        "wall_s": round(wall_s, 3),
        "events_per_s": round(events / wall_s, 1) if wall_s > 0 else None,
        "workers": workers,
        "inference_wait_share": round(wait_s / (wall_s * max(workers, 1)), 4) if wall_s > 0 else None,
        "client": {name: stats.to_dict() for name, stats in inference.items()},
        "server": {name: delta.to_dict() for name, delta in server_delta.items()},
        "cutflow": {name: {key: int(value) for key, value in entry.items()}
                    for name, entry in output["cutflow"].items()},
        "provenance": output["provenance"].to_dict() if "provenance" in output else [],
        # what happened to inference on the way (outages, retries, rows by fallback)
        "incidents": [incident.describe() for incident in getattr(inference, "incidents", ())],
    }


def histogram_digests(output: Mapping[str, Any]) -> dict[str, str]:
    """XXH3-64 of every histogram's counts, datasets in name order (two runs that filled the
    same histograms give the same digests, whatever order their chunks came in).

    >>> import hist
    >>> h = hist.Hist(hist.axis.StrCategory([], growth=True, name="dataset"),
    ...               hist.axis.Regular(2, 0, 1, name="x"))
    >>> _ = h.fill(dataset=["b", "a"], x=[0.2, 0.7])
    >>> len(histogram_digests({"h": h, "n": 3})["h"]), list(histogram_digests({"a": {"h": h}}))
    (16, ['a.h'])
    """
    import hist
    import numpy as np
    import xxhash

    digests = {}
    for name, value in output.items():
        if isinstance(value, Mapping):
            digests.update({f"{name}.{inner}": digest
                            for inner, digest in histogram_digests(value).items()})
            continue
        if not isinstance(value, hist.Hist):
            continue
        digest = xxhash.xxh3_64()
        if "dataset" in value.axes.name:
            for dataset in sorted(value.axes["dataset"]):
                digest.update(dataset.encode())
                digest.update(np.ascontiguousarray(value[{"dataset": dataset}].values(flow=True)))
        else:
            digest.update(np.ascontiguousarray(value.values(flow=True)))
        digests[name] = digest.hexdigest()
    return digests


def print_summary(summary: Mapping[str, Any]) -> None:
    print("\n=== coffea-sonic demo summary ===")
    print(f"events            {summary['events']:>12,d}   ({summary['events_per_s']:,.0f} events/s, "
          f"{summary['wall_s']:.1f} s wall, {summary['workers']} "
          f"worker{'' if summary['workers'] == 1 else 's'})")
    print(f"jets              {summary['jets']:>12,d}")
    for name, stats in summary["client"].items():
        print(f"{name:18s}{int(stats['rows']):>12,d} objects inferred in {int(stats['requests'])} "
              f"requests, {stats['bytes_sent'] / 1e6:.1f} MB sent, "
              f"{int(stats.get('fallback_rows', 0))} by fallback")
        if stats.get("cache_hits", 0) or stats.get("cache_misses", 0):
            print(f"{'':18s}{int(stats['cache_hit_rows']):>12,d} objects from the inference "
                  f"cache ({int(stats['cache_hits'])} hits, {int(stats['cache_misses'])} misses, "
                  f"{stats['cache_bytes_saved'] / 1e6:.1f} MB not sent)")
        if stats.get("shadow_rows", 0):
            print(f"{'':18s}{int(stats['shadow_rows']):>12,d} objects recomputed in-process by "
                  f"shadow validation, {int(stats['shadow_alarms'])} over its tolerance")
    for record in summary.get("provenance", []):
        print(f"answered by       {record['rows']:>12,d} rows of {record['model']} version "
              f"{record['version'] or '?'} at {record['source']} (config {record['config_digest']})")
    incidents = summary.get("incidents", [])
    print(f"incidents         {len(incidents):>12,d}   (outages, retries, rows by fallback; "
          "the run report has them all)" if incidents else
          "incidents                    0   (no outage, retry or fallback)")
    for line in incidents[:8]:
        print(f"  {line[:150]}")
    if len(incidents) > 8:
        print(f"  ... and {len(incidents) - 8} more")
    share = summary["inference_wait_share"]
    if share is not None:
        print(f"waiting on inference: {100 * share:.1f} % of worker wall time "
              "(the rest overlapped with CPU work or was CPU work)")
    print_server_statistics(summary["server"])


def print_server_statistics(server: Mapping[str, Mapping[str, float]]) -> None:
    """One line per served model: rows, executions, queue and compute time per request.

    >>> print_server_statistics({"trackgnn": {"inference_count": 4, "execution_count": 4,
    ...                                       "request_count": 4, "compute_infer_s": 2.0}})
    server trackgnn    4 rows in 4 executions (avg batch 1); queue 0.00 ms, compute 500.00 ms per request
    """
    for name, stats in server.items():
        count = stats.get("inference_count", 0)
        executions = stats.get("execution_count", 0) or 1
        per_request = 1e3 / max(stats.get("request_count", executions), 1)
        print(f"server {name:11s} {int(count):,d} rows in {int(executions)} executions "
              f"(avg batch {count / executions:,.0f}); queue {stats.get('queue_s', 0) * per_request:.2f} ms, "
              f"compute {stats.get('compute_infer_s', 0) * per_request:.2f} ms per request")


def _quiet_dask_logs() -> None:
    if not logging.getLogger().isEnabledFor(logging.INFO):
        # distributed logs every worker start/stop at INFO (its import sets that level, so
        # import it first); keep the demo's output readable.
        import distributed  # noqa: F401

        for name in ("distributed", "dask_jobqueue"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _start_server(args: argparse.Namespace, stack: ExitStack, models: list[str]) -> str:
    """URL of ``--server``, or of an embedded server serving ``models`` (stopped with ``stack``)."""
    if args.server:
        return args.server.rstrip("/")
    from .server import LocalTritonServer

    started = time.monotonic()
    server = stack.enter_context(LocalTritonServer(models=models, device=args.device))
    print(f"embedded Triton server ready in {time.monotonic() - started:.1f} s at "
          f"{server.grpc_address} ({server.device})", flush=True)
    return f"triton+grpc://{server.grpc_address}"


def _plot(plotter: Any, result: Any, path: Path) -> str | None:
    """Draw the run's plot to ``path``; without the plotting packages, say so and go on."""
    try:
        plotter(result, str(path))
    except ImportError as error:
        print(f"plot skipped: {error}", flush=True)
        return None
    return str(path)


def _cache_dir(args: argparse.Namespace) -> str | None:
    """``--inference-cache`` as an absolute path (workers may start in another directory)."""
    return (str(Path(args.inference_cache).expanduser().resolve()) if args.inference_cache
            else None)


def _schema(args: argparse.Namespace) -> type:
    from coffea.nanoevents import NanoAODSchema

    if args.files or args.fileset:
        return NanoAODSchema
    # The synthetic sample has no leptons, so NanoAODSchema would warn about every lepton
    # cross-reference, in every worker, for every chunk.
    return type("SyntheticNanoAODSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})


def _run_processor(args: argparse.Namespace, stack: ExitStack, fileset: Mapping[str, list[str]],
                   analysis: Any) -> tuple[Any, float, int, dict[str, Any]]:
    """Run ``analysis`` over ``fileset``: output, wall time, workers, the models' statistics."""
    from coffea import processor

    urls = {name: analysis.sonic_model_urls()[name][0] for name in analysis.sonic_models}
    executor, workers = _executor(args, stack)
    runner = processor.Runner(executor=executor, schema=_schema(args), chunksize=args.chunksize,
                              savemetrics=False)
    before = _server_statistics(urls)
    started = time.monotonic()
    result = runner({name: {"files": {path: args.treename for path in files}}
                     for name, files in fileset.items()},
                    treename=args.treename, processor_instance=analysis)
    wall_s = time.monotonic() - started
    after = _server_statistics(urls)
    delta = {name: after[name] - before[name] for name in before if name in after}
    return result, wall_s, workers, delta


def _machine() -> dict[str, Any]:
    return {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()}


def run(args: argparse.Namespace) -> int:
    resolve_defaults(args)
    _quiet_dask_logs()
    output = Path(args.output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    fileset = prepare_fileset(args, output)
    if args.analysis == "tracking":
        return _run_tracking(args, output, fileset)
    from .examples.jet_tagging import JetTaggingProcessor, plot_scores

    with ExitStack() as stack:
        base = _start_server(args, stack,
                             ["jet_tagger"] if args.no_constituents else list(DEMO_MODELS))
        analysis = JetTaggingProcessor(base, physics=not args.no_constituents,
                                       use_constituents=False if args.no_constituents else "auto",
                                       max_in_flight=args.max_in_flight, cache=_cache_dir(args))
        result, wall_s, workers, delta = _run_processor(args, stack, fileset, analysis)
    summary = summarise(result, wall_s, workers, delta)
    summary["histograms"] = histogram_digests(result)
    summary.update({"plot": _plot(plot_scores, result, output / "scores.png"),
                    "machine": _machine(), "executor": args.executor, "fileset": fileset})
    (output / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print_summary(summary)
    print(f"\nplot:    {summary['plot']}\nsummary: {output / 'summary.json'}")
    return 0


def _first_events(args: argparse.Namespace, fileset: Mapping[str, list[str]], count: int) -> Any:
    """The first ``count`` events of the fileset's first file, eagerly."""
    from coffea.nanoevents import NanoEventsFactory

    path = next(iter(fileset.values()))[0]
    return NanoEventsFactory.from_root({path: args.treename}, schemaclass=_schema(args),
                                       mode="eager", entry_stop=count).events()


def _require_hits(args: argparse.Namespace, fileset: Mapping[str, list[str]]) -> None:
    """Refuse files without tracker hits before any server or worker starts."""
    import uproot

    from .errors import InputValidationError

    for files in fileset.values():
        for path in files:
            try:
                handle = uproot.open(path)
            except OSError as error:
                raise InputValidationError(f"cannot open {path}: {error}") from None
            with handle:
                if args.treename not in handle:
                    raise InputValidationError(
                        f"{path} has no {args.treename!r} tree; name it with --treename")
                tree = handle[args.treename]
                if "nHit" not in tree.keys():
                    raise InputValidationError(
                        f"--analysis tracking needs tracker hits (branches nHit, Hit_x, Hit_y, "
                        f"Hit_z, Hit_track_id) and {path} has none in its {args.treename!r} tree "
                        "(real NanoAOD has no tracker hits); run it on the synthetic sample "
                        "(leave out --files/--fileset) or on files written by `coffea-sonic "
                        "sample`")
            return  # the first file of the first dataset says what kind of files these are


def _run_tracking(args: argparse.Namespace, output: Path, fileset: Mapping[str, list[str]]) -> int:
    """``--analysis tracking``: TrackingProcessor over ``fileset`` with the served pipeline, the
    served labels of the first events against an in-process run, report, plot, summary.json."""
    from .examples.tracking import (TrackingProcessor, compare_with_direct, plot_tracking,
                                    print_tracking_summary, summarise_tracking)

    _require_hits(args, fileset)
    ensemble = args.pipeline == "ensemble"
    with ExitStack() as stack:
        base = _start_server(args, stack, ["trackgnn", "trackgnn_ensemble"] if ensemble
                             else ["trackgnn"])
        analysis = TrackingProcessor(base, ensemble=ensemble, max_in_flight=args.max_in_flight,
                                     cache=_cache_dir(args))
        result, wall_s, workers, delta = _run_processor(args, stack, fileset, analysis)
        check = compare_with_direct(analysis, _first_events(args, fileset, CHECK_EVENTS))
    plot = output / "tracking.png"
    summary = summarise_tracking(result, wall_s, workers)
    summary.update({"server": {name: stats.to_dict() for name, stats in delta.items()},
                    "served_vs_direct": check, "plot": _plot(plot_tracking, result, plot),
                    "machine": _machine(),
                    "executor": args.executor, "pipeline": analysis.model, "fileset": fileset})
    (output / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print_tracking_summary(summary)
    print_server_statistics(summary["server"])
    print(f"served vs direct  {check['verdict']}")
    print(f"\nplot:    {summary['plot']}\nsummary: {output / 'summary.json'}")
    return 0
