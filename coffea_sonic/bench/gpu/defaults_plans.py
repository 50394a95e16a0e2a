"""The plans of :mod:`coffea_sonic.bench.gpu.defaults_sweep` (which server configurations it
starts and which client runs it measures against each) and what each of its client processes
runs (:func:`run_task`, handed to :class:`~coffea_sonic.bench.clients.ClientPool`): a loop on
fixed chunks through ``TritonModel`` or an in-process engine.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from coffea_sonic.bench.client import max_abs_difference
from coffea_sonic.bench.clients import ready_then_start, timed_calls

MiB = 1 << 20
#: Rows per chunk, per model (the workloads the defaults were chosen for).
CHUNK_ROWS = {"emtrk_cnn": 2048, "jet_tagger": 65536}


@dataclass
class Run:
    """One measurement: ``procs`` client processes of ``kind`` on ``model``."""

    kind: str  # "local" (GpuEngine), "triton" (TritonModel), "verify" (served == in-process)
    model: str
    procs: int = 1
    client: dict = field(default_factory=dict)  # TritonModel keyword arguments


@dataclass
class Server:
    """One server configuration (None: no server, in-process runs only)."""

    name: str
    instances: int | None = None  # None: LocalTritonServer's default
    options: dict = field(default_factory=dict)  # repository_options
    runs: list[Run] = field(default_factory=list)
    default: bool = False  # LocalTritonServer(models, device="gpu") with nothing else


def _t(model: str, procs: int, mrb_mib: float | None = None, mif: int | None = None,
       transport: str | None = None) -> Run:
    client = {"max_request_bytes": None if mrb_mib is None else int(mrb_mib * MiB),
              "max_in_flight": mif, "transport": transport}
    return Run("triton", model, procs, {k: v for k, v in client.items() if v is not None})


def plan_final(include_16: bool = True) -> list[Server]:
    baselines = Server("in-process", runs=[Run("local", "emtrk_cnn"), Run("local", "jet_tagger")])
    served = [Run("verify", "emtrk_cnn"), Run("verify", "jet_tagger"),
              Run("triton", "emtrk_cnn", 1), Run("triton", "emtrk_cnn", 8)]
    if include_16:
        served.append(Run("triton", "emtrk_cnn", 16))
    served.append(Run("triton", "jet_tagger", 8))
    # beside the defaults: system shared memory for GPU models too (what auto chooses where the
    # client has no CUDA)
    served += [_t("emtrk_cnn", 1, transport="shm"), _t("emtrk_cnn", 8, transport="shm")]
    return [baselines, Server("defaults", default=True, runs=served),
            Server("in-process again", runs=[Run("local", "emtrk_cnn")])]


def plan_smoke() -> list[Server]:
    """A few seconds of every code path with jet_tagger only (any machine, ``--device cpu`` too)."""
    return [Server("in-process", runs=[Run("local", "jet_tagger")]),
            Server("defaults", default=True,
                   runs=[Run("verify", "jet_tagger"), Run("triton", "jet_tagger", 1)]),
            Server("2 instances, queue delay 0", 2, {"max_queue_delay_microseconds": 0},
                   runs=[_t("jet_tagger", 2, 0.5, 2), _t("jet_tagger", 1, 4, 4, "grpc")])]


def plan_gpus() -> list[Server]:
    """Several GPUs: the default server uses every visible GPU; aggregate served rows/s
    against one process in-process on one GPU (goal: >= 0.9 x N GPUs). Client processes scale
    with the machine (about 14 per GPU, leaving cores to the server)."""
    cores = os.cpu_count() or 16
    counts = sorted({8, 16, cores // 2, max(8, cores - 4)})
    return [Server("in-process (one GPU)", runs=[Run("local", "emtrk_cnn")]),
            Server("defaults, every GPU", default=True,
                   runs=[Run("verify", "emtrk_cnn")]
                   + [Run("triton", "emtrk_cnn", n) for n in counts]),
            Server("in-process again", runs=[Run("local", "emtrk_cnn")])]


PLANS = {"final": plan_final, "gpus": plan_gpus, "smoke": plan_smoke}


def _make_runner(task: dict, cache: dict):
    kind, model = task["kind"], task["model"]
    if kind == "local":
        key = ("local", model, task["device"])
        if key not in cache:
            from coffea_sonic.engines import CpuEngine, GpuEngine

            cache[key] = GpuEngine(model) if task["device"] == "gpu" else CpuEngine(model)
        return cache[key], None
    if kind == "triton":
        from coffea_sonic import TritonModel

        client = TritonModel(task["url"], timeout_s=120, **task["client"])
        return client, client
    raise ValueError(f"unknown run kind {kind!r}")


def _client_stats(client) -> dict:
    stats = getattr(client, "stats", None)
    return {name: getattr(stats, name, 0) for name in ("requests", "latency_s", "wait_s", "retries",
                                                       "failed_requests", "fallback_rows")}


def _verify(task: dict, cache: dict) -> dict:
    """max |served - in-process| on one chunk (TritonModel at the run's options vs the engine)."""
    from coffea_sonic import TritonModel, zoo

    inputs = zoo.example_inputs(task["model"], task["rows"], seed=99)
    local, _ = _make_runner(dict(task, kind="local"), cache)
    reference = local(inputs)
    client = TritonModel(task["url"], timeout_s=120, **task["client"])
    served = client(inputs)
    client.close()
    return {"max_abs_diff": max_abs_difference(served, reference)}


def run_task(task: dict, tasks, control, cache: dict) -> dict:
    from coffea_sonic import zoo

    rows = task["rows"]
    if task["kind"] == "verify":
        result = _verify(task, cache)
        control.put(("ready", os.getpid()))
        tasks.get()
        return result
    inputs = zoo.example_inputs(task["model"], rows, seed=1 + task["index"])
    runner, client = _make_runner(task, cache)
    for _ in range(3):  # warm-up: connections, regions, kernels
        runner(inputs)
    before = _client_stats(client) if client is not None else {}
    latencies, elapsed = timed_calls(lambda _: runner(inputs), ready_then_start(tasks, control),
                                     task["duration"])
    done = rows * len(latencies)
    result = {"rows": done, "elapsed_s": elapsed, "rows_per_s": done / elapsed if done else 0.0,
              "chunk_ms_p50": 1e3 * float(np.median(latencies)) if latencies else None,
              "chunks": len(latencies)}
    if client is not None:
        result["transport"] = getattr(client, "transport_kind", None)
        after = _client_stats(client)
        delta = {name: after[name] - before.get(name, 0) for name in after}
        requests = max(delta["requests"], 1)
        result["client"] = {"requests_per_chunk": round(delta["requests"] / max(len(latencies), 1), 2),
                            "request_latency_ms": round(1e3 * delta["latency_s"] / requests, 3),
                            "retries": delta["retries"], "failed": delta["failed_requests"],
                            "fallback_rows": delta["fallback_rows"]}
        if hasattr(client, "close"):
            client.close()
    return result

