"""``coffea-sonic bench cache``: what the inference cache and Triton's response cache save.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..files import write_json
from . import add_numbers, old_spellings, progress_printer, scenario_parser

__all__ = ["demo_twice", "load_now", "record_calls", "register", "shared_users", "user_main"]


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``cache`` to the ``bench`` scenarios."""
    parser = scenario_parser(
        subparsers, "cache", run=run,
        help="the demo twice with the inference cache; users sharing a response cache",
        description=(
            "demo-twice: coffea-sonic demo --inference-cache DIR twice (own server and Dask each "
            "time).\n"
            "users: N users run the demo's analysis on the same events against one server, "
            "Triton's response cache off, then on.\n\n"
            "examples:\n  coffea-sonic bench cache --scenario demo-twice -o cache\n"
            "  coffea-sonic bench cache --scenario users --users 10 -o cache"))
    parser.add_argument("--scenario", choices=("demo-twice", "users"), default="demo-twice",
                        help="demo-twice: the demo twice with an inference cache; users: N users "
                             "sharing one server's response cache (default: %(default)s)")
    add_numbers(parser, [("--users", int, 10, "users"),
                         ("--events", int, 20_000, "events per dataset, 2 datasets")])
    parser.add_argument("--stagger-s", type=float, default=2.0, metavar="SECONDS",
                        help="users start this many seconds apart (default: %(default)s)")
    parser.add_argument("--cache-size", default="1GB", help="response cache size (default 1GB)")
    parser.add_argument("--demo-args", default="", metavar="ARGS",
                        help="more options for both demo runs, e.g. '--device gpu --workers 8'")
    return old_spellings(parser, "--stagger")


def run(args: argparse.Namespace) -> int:
    """``<scenario>.json`` in ``--output``."""
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    progress = progress_printer()
    if args.scenario == "demo-twice":
        results = demo_twice(output, args.demo_args.split(), progress)
    else:
        results = shared_users(output, users=args.users, events=args.events,
                               stagger_s=args.stagger_s, cache_size=args.cache_size,
                               progress=progress)
    print(json.dumps({key: value for key, value in results.items()
                      if key not in ("runs", "settings")}, indent=2, default=str))
    write_json(results, output, f"{args.scenario}.json")
    return 0


MODELS = ("jet_tagger", "particlenet", "deepmet")


def load_now() -> dict[str, Any]:
    """The 1/5/15-minute load averages, the machine's CPUs, host and time."""
    one, five, fifteen = os.getloadavg()
    return {"load_1m": one, "load_5m": five, "load_15m": fifteen, "cpus": os.cpu_count(),
            "host": platform.node(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _demo(output: Path, cache: Path, extra: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "coffea_sonic.cli", "demo", "--output", str(output),
               "--inference-cache", str(cache), "--no-progress", *extra]
    load = load_now()
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True)
    process_s = time.perf_counter() - started
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{completed.stdout[-2000:]}"
                           f"\n{completed.stderr[-2000:]}")
    summary = json.loads((output / "summary.json").read_text())
    return {"command": " ".join(command[1:]), "process_s": round(process_s, 2),
            "analysis_wall_s": summary["wall_s"], "events": summary["events"],
            "requests": {name: int(stats.get("success_count", 0))
                         for name, stats in summary["server"].items()},
            "client": summary["client"], "histograms": summary["histograms"],
            "load_before": load, "load_after": load_now()}


def demo_twice(output: Path, extra: list[str], progress: Callable[[str], None] = print
               ) -> dict[str, Any]:
    """The demo twice over one fresh cache directory (``extra``: more demo options)."""
    import shutil

    cache = output / "inference-cache"
    shutil.rmtree(cache, ignore_errors=True)
    runs = []
    for index in (1, 2):
        progress(f"demo run {index} of 2")
        runs.append(_demo(output / f"run{index}", cache, extra))
    first, second = runs
    return {"scenario": "demo-twice", "machine": load_now(), "runs": runs,
            "second_run_requests": sum(second["requests"].values()),
            "identical_histograms": first["histograms"] == second["histograms"],
            "analysis_speedup": round(first["analysis_wall_s"] / second["analysis_wall_s"], 2),
            "process_speedup": round(first["process_s"] / second["process_s"], 2)}


def record_calls(base: str, fileset: dict[str, list[str]], folder: Path,
                 chunksize: int = 10_000) -> int:
    """Run the demo's analysis once against ``base`` and keep every inference call it makes
    (``folder/callN.npz``, in order, with its chunk); returns the number of calls."""
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    from ...examples.jet_tagging import JetTaggingProcessor
    from ...model import TritonModel

    folder.mkdir(parents=True, exist_ok=True)
    calls: list[dict[str, Any]] = []
    chunk = [0]
    original_infer, original_process = TritonModel.infer_async, JetTaggingProcessor.process

    def recording_infer(model: TritonModel, inputs: Any, *, counts: Any = None) -> Any:
        import numpy as np

        np.savez(folder / f"call{len(calls)}.npz", **inputs)
        calls.append({"model": model.model_name, "chunk": chunk[0]})
        return original_infer(model, inputs, counts=counts)

    def counting_process(analysis: Any, events: Any) -> Any:
        chunk[0] += 1
        return original_process(analysis, events)

    schema = type("SyntheticNanoAODSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
    TritonModel.infer_async = recording_infer  # type: ignore[method-assign]
    JetTaggingProcessor.process = counting_process  # type: ignore[method-assign]
    try:
        # no retries: a chunk done twice would be recorded twice
        processor.Runner(executor=processor.IterativeExecutor(retries=0), schema=schema,
                         chunksize=chunksize, savemetrics=False)(
            {name: {"files": {path: "Events" for path in files}} for name, files in fileset.items()},
            treename="Events",
            processor_instance=JetTaggingProcessor(base, physics=True, cache=False))
    finally:
        TritonModel.infer_async = original_infer  # type: ignore[method-assign]
        JetTaggingProcessor.process = original_process  # type: ignore[method-assign]
    (folder / "calls.json").write_text(json.dumps(calls))
    return len(calls)


def user_main(server: str, folder: Path, out: Path) -> int:
    """One simulated user (its own process): the calls :func:`record_calls` kept in ``folder``,
    each chunk's in flight together as the processor sends them, against ``server``."""
    import numpy as np
    import xxhash

    from ...model import TritonModel

    calls = json.loads((folder / "calls.json").read_text())
    # analysts on other machines reach the server over gRPC (no shared memory)
    models = {name: TritonModel(f"{server}/{name}", cache=False, transport="grpc")
              for name in {call["model"] for call in calls}}
    digest = xxhash.xxh3_64()
    started = time.perf_counter()
    for chunk in sorted({call["chunk"] for call in calls}):
        # one chunk's inputs in memory at a time (ten users share the box's memory)
        pending = [models[call["model"]].infer_async(dict(np.load(folder / f"call{index}.npz")))
                   for index, call in enumerate(calls) if call["chunk"] == chunk]
        for handle in pending:
            for name, array in sorted(handle.result().items()):
                digest.update(np.ascontiguousarray(array))
    wall_s = time.perf_counter() - started
    out.write_text(json.dumps({
        "wall_s": wall_s, "outputs_digest": digest.hexdigest(),
        "requests": {name: model.stats.requests for name, model in models.items()}}))
    return 0


def _one_setting(fileset: dict[str, list[str]], output: Path, users: int, stagger_s: float,
                 cache_bytes: int | None) -> dict[str, Any]:
    from ...server import LocalTritonServer
    from ..probes import ServerMeter

    label = "on" if cache_bytes else "off"
    with LocalTritonServer(models=list(MODELS), device="cpu",
                           response_cache=cache_bytes) as server:
        base = f"triton+grpc://{server.grpc_address}"
        calls = output / "calls"
        if not (calls / "calls.json").exists():  # recorded where it leaves no cached answers
            record_calls(base, fileset, calls)
        meter = ServerMeter(server.grpc_address, MODELS)
        meter.start()
        load = load_now()
        started = time.perf_counter()
        processes = []
        for index in range(users):
            out = output / f"cache-{label}-user{index}.json"
            processes.append((out, subprocess.Popen(
                [sys.executable, "-m", "coffea_sonic.bench.commands.cache", base, str(calls),
                 str(out)])))
            if index + 1 < users:
                time.sleep(stagger_s)  # users arrive apart, as analysts do
        for out, process in processes:
            if process.wait() != 0:
                raise RuntimeError(f"user {out.stem} failed (exit {process.returncode})")
        elapsed = time.perf_counter() - started
        meter.stop(settle_s=0.5)
    delta = {name: (meter.after[name] - meter.before[name]).to_dict() for name in MODELS}
    per_user = [json.loads(out.read_text()) for out, _ in processes]
    total = {key: sum(d[key] for d in delta.values()) for key in (
        "compute_infer_s", "execution_count", "success_count", "cache_hit_count",
        "cache_miss_count")}
    return {"response_cache": label, "users": users, "stagger_s": stagger_s,
            "all_users_s": round(elapsed, 2),
            "user_wall_s": [round(user["wall_s"], 2) for user in per_user],
            "mean_user_wall_s": round(sum(u["wall_s"] for u in per_user) / users, 2),
            "server_compute_s": round(total["compute_infer_s"], 2),
            "server_executions": int(total["execution_count"]),
            "server_requests": int(total["success_count"]),
            "cache_hits": int(total["cache_hit_count"]),
            "cache_misses": int(total["cache_miss_count"]), "per_model": delta,
            "same_outputs": len({user["outputs_digest"] for user in per_user}) == 1,
            "load_before": load, "load_after": load_now()}


def shared_users(output: Path, users: int = 10, events: int = 20_000, stagger_s: float = 2.0,
                 cache_size: str = "1GB", progress: Callable[[str], None] = print
                 ) -> dict[str, Any]:
    """``users`` processes, the same events, one server: response cache off, then on."""
    from ...cache import parse_size
    from ...data.synthetic import write_sample

    output.mkdir(parents=True, exist_ok=True)
    progress(f"writing the sample ({events} events per dataset, 2 datasets)")
    fileset = write_sample(output / "sample", events=events, files=2, seed=0)
    settings = []
    for cache_bytes in (None, parse_size(cache_size)):
        progress(f"{users} users, response cache {'on' if cache_bytes else 'off'}")
        settings.append(_one_setting(fileset, output, users, stagger_s, cache_bytes))
    off, on = settings
    return {"scenario": "users", "machine": load_now(), "events": 2 * events,
            "settings": settings,
            "server_compute_ratio_off_on": round(off["server_compute_s"]
                                                 / max(on["server_compute_s"], 1e-9), 2),
            "mean_user_wall_ratio_off_on": round(off["mean_user_wall_s"]
                                                 / on["mean_user_wall_s"], 2)}


if __name__ == "__main__":
    sys.exit(user_main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
