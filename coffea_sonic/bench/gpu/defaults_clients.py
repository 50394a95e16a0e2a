"""What each client process of :mod:`coffea_sonic.bench.gpu.defaults_sweep` runs: a loop on
fixed chunks through ``TritonModel``, an in-process engine or ``CudaShmTransport`` from host
arrays (:func:`run_task`, handed to :class:`~coffea_sonic.bench.clients.ClientPool`).

>>> _client_stats(None)["requests"]
0
"""

from __future__ import annotations

import os
import time

import numpy as np

from coffea_sonic.bench.client import max_abs_difference
from coffea_sonic.bench.clients import ready_then_start


def _make_runner(task: dict, cache: dict):
    from coffea_sonic import zoo

    kind, model = task["kind"], task["model"]
    if kind == "local":
        key = ("local", model, task["device"])
        if key not in cache:
            from coffea_sonic.engines import CpuEngine, GpuEngine

            cache[key] = GpuEngine(model) if task["device"] == "gpu" else CpuEngine(model)
        return cache[key], None
    if kind == "triton":
        from coffea_sonic import TritonModel
        from coffea_sonic.routing import clear_routers
        from coffea_sonic.transport.registry import close_all_transports

        options = dict(task["client"])
        connections = str(options.pop("connections", ""))
        if connections != os.environ.get("COFFEA_SONIC_GRPC_CONNECTIONS", ""):
            # the process' pooled transports were made with the previous count
            clear_routers()
            close_all_transports()
            os.environ["COFFEA_SONIC_GRPC_CONNECTIONS"] = connections
            if not connections:
                del os.environ["COFFEA_SONIC_GRPC_CONNECTIONS"]
        client = TritonModel(task["url"], timeout_s=120, **options)
        return client, client
    if kind == "cuda-host":
        from coffea_sonic.transport.shm import CudaShmTransport

        key = ("cuda", task["grpc"])
        if key not in cache:
            cache[key] = CudaShmTransport(task["grpc"])
        transport = cache[key]
        from coffea_sonic.transport.base import InferRequest

        outputs = zoo.declared_info(model).outputs
        pieces = int(task["client"].get("pieces", 1))

        def call(inputs):
            # equal pieces, all sent before the first answer is awaited (the next piece's
            # host-to-device copy overlaps the server's work on the previous one); host arrays
            # in, host arrays out
            rows = len(next(iter(inputs.values())))
            bounds = [rows * part // pieces for part in range(pieces + 1)]
            futures = [transport.submit(InferRequest(
                model, "", {k: v[a:b] for k, v in inputs.items()}, outputs, rows=b - a,
                timeout_s=120)) for a, b in zip(bounds[:-1], bounds[1:])]
            answers = [future.result().outputs for future in futures]
            return {name: np.concatenate([a[name] for a in answers]) for name in answers[0]}

        return call, None
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
    start_at = ready_then_start(tasks, control)
    end = start_at + task["duration"]
    done = 0
    last = start_at
    latencies = []
    while time.time() < end:
        began = time.perf_counter()
        runner(inputs)
        latencies.append(time.perf_counter() - began)
        done += rows
        last = time.time()
    result = {"rows": done, "elapsed_s": last - start_at,
              "rows_per_s": done / (last - start_at) if done else 0.0,
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

