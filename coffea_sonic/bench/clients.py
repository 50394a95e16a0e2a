"""Client processes for benchmarks: ``size`` spawned processes that start a run together.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue as queues
import time
from typing import Any, Callable

__all__ = ["ClientPool", "fresh_clients", "ready_then_start", "timed_calls"]

RunTask = Callable[[dict, Any, Any, dict], Any]


def fresh_clients() -> None:
    """Forget every router and close every cached transport: the next TritonModel connects anew
    and reads its settings from the environment again.

    >>> from coffea_sonic.core.endpoint import ServerSettings
    >>> from coffea_sonic.transport.registry import open_transport
    >>> cached = open_transport(ServerSettings("127.0.0.1:1"), "grpc")
    >>> fresh_clients()
    >>> open_transport(ServerSettings("127.0.0.1:1"), "grpc") is cached
    False
    """
    from ..routing import clear_routers
    from ..transport.registry import close_all_transports

    clear_routers()
    close_all_transports()


def ready_then_start(tasks: Any, control: Any) -> float:
    """In a client process: say it is ready, wait for the pool's common start; returns it."""
    control.put(("ready", os.getpid()))
    start_at = tasks.get()
    while time.time() < start_at:
        time.sleep(0.0005)
    return start_at


def timed_calls(call: Callable[[int], Any], start_at: float, duration: float,
                then: Callable[[int, Any], None] | None = None) -> tuple[list[float], float]:
    """In a client process: ``call(i)`` back to back from ``start_at`` (``time.time()``, the
    pool's common start) until ``duration`` s later, ``then(i, answer)`` after each outside its
    time; each call's seconds and the seconds from ``start_at`` to the end of the last call.

    >>> seconds, elapsed = timed_calls(lambda i: i, time.time(), 0.01)
    >>> len(seconds) > 0 and elapsed > 0
    True
    """
    seconds: list[float] = []
    last = start_at
    while time.time() < start_at + duration:
        began = time.perf_counter()
        answer = call(len(seconds))
        seconds.append(time.perf_counter() - began)
        last = time.time()
        if then is not None:
            then(len(seconds) - 1, answer)
    return seconds, last - start_at


def _serve(run_task: RunTask, tasks: Any, control: Any) -> None:
    logging.basicConfig(level=logging.WARNING)
    cache: dict = {}
    while True:
        task = tasks.get()
        if task is None:
            return
        if not isinstance(task, dict):  # the start signal of a run this process failed to join
            continue
        try:
            result = run_task(task, tasks, control, cache)
        except BaseException as error:  # noqa: BLE001 - reported to the main process
            control.put(("ready", os.getpid()))
            result = {"error": f"{type(error).__name__}: {error}"[:2000]}
        control.put(("result", result))


class ClientPool:
    """``size`` spawned client processes running ``run_task`` (docs/internals/bench.md)."""

    def __init__(self, size: int, run_task: RunTask) -> None:
        context = mp.get_context("spawn")
        self.size = size
        self.control = context.Queue()
        self.queues = [context.Queue() for _ in range(size)]
        self.processes = [context.Process(target=_serve, args=(run_task, q, self.control),
                                          daemon=True) for q in self.queues]
        for process in self.processes:
            process.start()

    def run(self, task: dict, procs: int,
            on_start: Callable[[float], None] | None = None) -> tuple[float, list[dict]]:
        """Run ``task`` on ``procs`` processes started together; (start time, their results)."""
        for index, q in enumerate(self.queues[:procs]):
            q.put(dict(task, index=index))
        ready, results = 0, []  # a process that failed early reports before the others are ready
        while ready < procs:
            kind, value = self._get(procs, 300)
            ready += kind == "ready"
            if kind == "result":
                results.append(value)
        start_at = time.time() + 0.2
        for q in self.queues[:procs]:
            q.put(start_at)
        if on_start is not None:
            on_start(start_at)
        while len(results) < procs:
            kind, value = self._get(procs, task["duration"] + 120)
            if kind == "result":
                results.append(value)
        return start_at, results

    def measure(self, task: dict, procs: int, *, server: str | None = None,
                model: str | None = None, gpu: Any = None) -> dict[str, Any]:
        """:meth:`run`, and what the server and the GPUs did meanwhile: ``start``, ``results``,
        ``errors`` (the failed processes'), ``server_profile`` (Triton's, of ``model`` at the
        gRPC address ``server``, over ``task["duration"]``; None without both) and
        ``gpu_percent`` (the mean busy of ``gpu``, a GpuUtilisation; None without)."""
        from .probes import ServerMeter, server_profile

        meter = ServerMeter(server, [model] if model else [])
        meter.start()
        start, results = self.run(task, procs)
        meter.stop()
        summary = meter.summary(model or "", task["duration"])
        # the GPUs' mean busy leaves out the window's first 0.2 s (ramp-up)
        busy = None if gpu is None else gpu.mean_between(start + 0.2, start + task["duration"])
        return {"start": start, "results": results,
                "server_profile": server_profile(summary) if summary else None,
                "errors": [result["error"] for result in results if "error" in result],
                "gpu_percent": None if busy is None else round(busy, 1)}

    def _get(self, procs: int, timeout_s: float) -> tuple[str, Any]:
        """The next control message; RuntimeError if a process died or nothing came in time."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            try:
                return self.control.get(timeout=2)
            except queues.Empty:
                dead = [p.pid for p in self.processes[:procs] if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"client process(es) {dead} died") from None
        raise RuntimeError(f"no answer from the client processes within {timeout_s:.0f} s")

    def close(self) -> None:
        """Stop every process (killing those that do not stop within 10 s)."""
        for q in self.queues:
            q.put(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
