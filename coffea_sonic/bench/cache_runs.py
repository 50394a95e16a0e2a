"""What the caches save: the demo run twice with the inference cache, and users sharing one
server's response cache.

* :func:`demo_twice`: ``coffea-sonic demo --inference-cache DIR`` twice (each its own process, its own
  embedded server and Dask cluster, as a user would run it): both runs' wall times, requests per
  model as the server counted them, and whether the histograms are identical.
* :func:`shared_users`: one embedded server with the demo's models; the demo's analysis runs
  once (coffea ``Runner``, iterative executor, 40 000 events, the demo's chunks) and every
  inference call it makes is recorded; then ``users`` processes, started ``stagger_s`` apart,
  each send those same calls chunk by chunk (the events' reading and feature building, the same
  for every user and not the server's business, is left out, so the 2-core box measures the
  serving), with Triton's response cache off, then on (a fresh server each): the server's
  compute time and executions, cache hits, and the users' wall times. Identical requests in flight at the same moment all miss (Triton does not merge them),
  so users who start together gain less than users who start apart.

The machine's load (``os.getloadavg``) is recorded beside every figure: on a shared box timings
are only comparable within one run.

>>> load_now()["cpus"] == os.cpu_count()
True
"""

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

from ..stats import settled

__all__ = ["demo_twice", "load_now", "record_calls", "shared_users", "user_main"]

MODELS = ("jet_tagger", "particlenet", "deepmet")


def load_now() -> dict[str, Any]:
    """The 1/5/15-minute load averages and the machine's CPUs."""
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
    cache = output / "inference-cache"
    if cache.exists():
        import shutil

        shutil.rmtree(cache)
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

    from ..examples.jet_tagging import JetTaggingProcessor
    from ..model import TritonModel

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


def user_main(argv: list[str] | None = None) -> int:
    """One simulated user: the recorded calls of the demo's analysis, chunk by chunk (each
    chunk's calls in flight together, as the processor sends them), against ``--server``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--calls", required=True, help="folder written by record_calls")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import numpy as np
    import xxhash

    from ..model import TritonModel

    folder = Path(args.calls)
    calls = json.loads((folder / "calls.json").read_text())
    # analysts on other machines reach the server over gRPC (no shared memory)
    models = {name: TritonModel(f"{args.server}/{name}", cache=False, transport="grpc")
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
    Path(args.out).write_text(json.dumps({
        "wall_s": wall_s, "outputs_digest": digest.hexdigest(),
        "requests": {name: model.stats.requests for name, model in models.items()}}))
    return 0


def _server_totals(base: str) -> dict[str, Any]:
    from ..model import TritonModel

    return {name: TritonModel(f"{base}/{name}").server_statistics() for name in MODELS}


def _settled_totals(base: str) -> dict[str, Any]:
    """The servers' totals once they stop changing (:func:`~coffea_sonic.stats.settled`)."""
    return settled(lambda: _server_totals(base), gap_s=0.5, timeout_s=30.0)


def _one_setting(fileset: dict[str, list[str]], output: Path, users: int, stagger_s: float,
                 cache_bytes: int | None) -> dict[str, Any]:
    from ..server import LocalTritonServer

    label = "on" if cache_bytes else "off"
    with LocalTritonServer(models=list(MODELS), device="cpu",
                           response_cache=cache_bytes) as server:
        base = f"triton+grpc://{server.grpc_address}"
        calls = output / "calls"
        if not (calls / "calls.json").exists():  # recorded where it leaves no cached answers
            record_calls(base, fileset, calls)
        before = _server_totals(base)
        load = load_now()
        started = time.perf_counter()
        processes = []
        for index in range(users):
            out = output / f"cache-{label}-user{index}.json"
            processes.append((out, subprocess.Popen(
                [sys.executable, "-m", "coffea_sonic.bench.cache_runs", "--server", base,
                 "--calls", str(calls), "--out", str(out)])))
            if index + 1 < users:
                time.sleep(stagger_s)  # users arrive apart, as analysts do
        for out, process in processes:
            if process.wait() != 0:
                raise RuntimeError(f"user {out.stem} failed (exit {process.returncode})")
        elapsed = time.perf_counter() - started
        after = _settled_totals(base)
    delta = {name: (after[name] - before[name]).to_dict() for name in MODELS}
    per_user = [json.loads(out.read_text()) for out, _ in processes]
    return {"response_cache": label, "users": users, "stagger_s": stagger_s,
            "all_users_s": round(elapsed, 2),
            "user_wall_s": [round(user["wall_s"], 2) for user in per_user],
            "mean_user_wall_s": round(sum(u["wall_s"] for u in per_user) / users, 2),
            "server_compute_s": round(sum(d["compute_infer_s"] for d in delta.values()), 2),
            "server_executions": int(sum(d["execution_count"] for d in delta.values())),
            "server_requests": int(sum(d["success_count"] for d in delta.values())),
            "cache_hits": int(sum(d["cache_hit_count"] for d in delta.values())),
            "cache_misses": int(sum(d["cache_miss_count"] for d in delta.values())),
            "per_model": delta,
            "same_outputs": len({user["outputs_digest"] for user in per_user}) == 1,
            "load_before": load, "load_after": load_now()}


def shared_users(output: Path, users: int = 10, events: int = 20_000, stagger_s: float = 2.0,
                 cache_size: str = "1GB", progress: Callable[[str], None] = print
                 ) -> dict[str, Any]:
    """``users`` processes, the same events, one server: response cache off, then on."""
    from ..cache import parse_size
    from ..data.synthetic import write_sample

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
    sys.exit(user_main())
