"""TritonModel at its defaults beside NVIDIA's perf_analyzer, per model and transport, one run.

For each model and transport the bench measures perf_analyzer (:mod:`.perf_analyzer`) over a small
batch x concurrency grid and keeps its best rate, and a default :class:`~coffea_sonic.TritonModel`
in one client process calling the model on ``call_rows``-row chunks back to back (transport forced,
everything else at its default). The two alternate, one TritonModel window after each perf_analyzer
point, so both see the same load on a shared machine; the ratio is TritonModel's best window over
perf_analyzer's best point (a best of as many tries on each side).

Transports: ``grpc`` and ``http`` (perf_analyzer ``-i grpc|http``), ``shm`` (system shared memory:
``-i grpc --shared-memory system``), ``cuda`` (``--shared-memory cuda``; GPU machines). perf_analyzer
writes its inputs into the shared regions once and reuses them; TritonModel starts from host arrays
each call, as a user's chunk does, so its shared-memory rows include that copy.

Where perf_analyzer cannot be installed or run, the rows carry the reason and TritonModel is still
measured.

>>> config = ReferenceConfig()
>>> config.grid("passthrough")[:2]
[(16384, 1), (16384, 2)]
>>> config.call_rows_for("emtrk_cnn")
2048
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import zoo
from .clients import ready_then_start
from .passthrough import PASSTHROUGH, passthrough_inputs

__all__ = ["ReferenceConfig", "ReferenceRow", "ReferenceRun", "output_bytes", "tritonmodel_task"]

logger = logging.getLogger(__name__)

#: perf_analyzer's flags for each transport kind of TritonModel.
PA_TRANSPORTS: dict[str, tuple[str, str]] = {
    "grpc": ("grpc", "none"), "http": ("http", "none"), "shm": ("grpc", "system"),
    "cuda": ("grpc", "cuda")}


@dataclass
class ReferenceConfig:
    """Models, transports, the perf_analyzer grid and TritonModel's call size."""

    models: tuple[str, ...] = (PASSTHROUGH,)
    transports: tuple[str, ...] = ("grpc", "shm", "http")
    concurrencies: tuple[int, ...] = (1, 2, 4)
    batches: dict[str, tuple[int, ...]] = field(default_factory=lambda: {
        PASSTHROUGH: (16384, 65536), "emtrk_cnn": (256, 2048), "jet_tagger": (16384, 65536)})
    call_rows: dict[str, int] = field(default_factory=lambda: {
        PASSTHROUGH: 200_000, "emtrk_cnn": 2048, "jet_tagger": 65536})
    #: seconds of each TritonModel window
    window_s: float = 5.0
    #: perf_analyzer's measurement window (it takes 3 to 10 of them per point)
    pa_window_ms: int = 2500

    def call_rows_for(self, model: str) -> int:
        return self.call_rows.get(model, 65536)

    def grid(self, model: str) -> list[tuple[int, int]]:
        """(batch, concurrency) points of perf_analyzer for ``model``."""
        batches = self.batches.get(model, (self.call_rows_for(model),))
        return [(b, c) for b in batches for c in self.concurrencies]


@dataclass
class ReferenceRow:
    """One model x transport: perf_analyzer's points and best, TritonModel's windows, the ratio."""

    model: str
    transport: str
    call_rows: int
    pa_points: list[dict] = field(default_factory=list)
    pa_best: dict | None = None
    pa_error: str = ""
    tm_windows: list[float] = field(default_factory=list)
    tm_transport_used: str = ""
    tm_error: str = ""

    @property
    def tm_best(self) -> float:
        return max(self.tm_windows, default=0.0)

    @property
    def ratio(self) -> float | None:
        if not self.pa_best or not self.pa_best["rows_per_s"] or not self.tm_windows or \
                self.tm_error:
            return None
        return self.tm_best / self.pa_best["rows_per_s"]

    def to_dict(self) -> dict:
        record = asdict(self)
        record.update(tm_best=self.tm_best, ratio=self.ratio)
        return record


def model_inputs(model: str, rows: int) -> dict:
    """The chunk TritonModel sends: the passthrough's floats or the zoo's example inputs."""
    if model == PASSTHROUGH:
        return passthrough_inputs(rows)
    return zoo.example_inputs(model, rows)


def tritonmodel_task(task: dict, tasks: Any, control: Any, cache: dict) -> dict:
    """A client process' window (see :class:`~coffea_sonic.bench.clients.ClientPool`): calls of
    ``task["rows"]`` rows back to back on a default TritonModel for ``task["duration"]`` s."""
    from ..model import TritonModel

    from ..routing import clear_routers
    from ..transport.registry import close_all_transports
    from ..transport.shm.select import forget_probes

    # fresh transports and model per window: perf_analyzer unregisters every shared-memory region
    # of the server when it ends (ours too); re-registering them is not what a window measures
    previous = cache.pop("model", None)
    if previous is not None:
        previous.close()
    clear_routers()
    close_all_transports()
    forget_probes()
    key = (task["model"], task["rows"])
    if key not in cache:
        cache[key] = model_inputs(task["model"], task["rows"])
    inputs = cache[key]
    model = cache["model"] = TritonModel(task["url"], transport=task["transport"],
                                         **task.get("options", {}))
    for _ in range(3):  # connections, shared-memory regions, the server's first batches
        model(inputs)
    start_at = ready_then_start(tasks, control)
    calls, began = 0, time.perf_counter()
    while time.perf_counter() - began < task["duration"]:
        model(inputs)
        calls += 1
    elapsed = time.perf_counter() - began
    return {"rows_per_s": calls * task["rows"] / elapsed, "calls": calls,
            "transport_used": model.transport_kind}


def output_bytes(model: Any, batch: int) -> int:
    """Bytes of one perf_analyzer request's outputs (its output shared-memory regions' size)."""
    import math

    import numpy as np

    info = model.info
    return sum(batch * math.prod(max(d, 1) for d in tensor.dims) * np.dtype(tensor.dtype).itemsize
               for tensor in info.outputs)


class ReferenceRun:
    """Measures :class:`ReferenceRow` s against a server at ``address`` (``host:port`` of gRPC;
    ``http_address`` for perf_analyzer's HTTP rows). ``analyzer`` is None where perf_analyzer
    could not be had (``analyzer_error`` says why)."""

    def __init__(self, config: ReferenceConfig, pool: Any, analyzer: Any,
                 analyzer_error: str = "") -> None:
        self.config = config
        self.pool = pool
        self.analyzer = analyzer
        self.analyzer_error = analyzer_error

    def _window(self, row: ReferenceRow, url: str) -> None:
        task = {"url": url, "transport": row.transport, "rows": row.call_rows,
                "model": row.model, "duration": self.config.window_s}
        _, results = self.pool.run(task, 1)
        if "error" in results[0]:
            row.tm_error = results[0]["error"]
            return
        row.tm_windows.append(results[0]["rows_per_s"])
        row.tm_transport_used = results[0]["transport_used"]

    def measure(self, model: str, transport: str, grpc_address: str, http_address: str,
                output_bytes: Any) -> ReferenceRow:
        """One row: a TritonModel window after every perf_analyzer point (at least two)."""
        row = ReferenceRow(model, transport, self.config.call_rows_for(model))
        url = f"triton+grpc://{grpc_address}/{model}"
        if transport == "http":
            url = f"triton+http://{http_address}/{model}"
        self._window(row, url)
        protocol, shared = PA_TRANSPORTS[transport]
        address = http_address if protocol == "http" else grpc_address
        for batch, concurrency in self.config.grid(model):
            if self.analyzer is None:
                row.pa_error = self.analyzer_error
                break
            point = self.analyzer.measure(model, address, protocol, batch, concurrency, shared,
                                          output_bytes(batch), self.config.pa_window_ms)
            row.pa_points.append(asdict(point))
            logger.info("%s %s perf_analyzer b=%d c=%d: %.3g rows/s %s", model, transport, batch,
                        concurrency, point.rows_per_s, point.error)
            if not row.tm_error:
                self._window(row, url)
        if self.analyzer is None and not row.tm_error:
            self._window(row, url)
        good = [p for p in row.pa_points if p["rows_per_s"] > 0]
        row.pa_best = max(good, key=lambda p: p["rows_per_s"], default=None)
        if not good and row.pa_points:
            row.pa_error = "; ".join(sorted({p["error"] for p in row.pa_points}))[:600]
        return row
