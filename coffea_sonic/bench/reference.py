"""TritonModel at its defaults beside NVIDIA's perf_analyzer, per model and transport, one run.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .. import zoo
from .clients import ClientPool, fresh_clients, ready_then_start, timed_calls
from .files import pyplot, save_figure, table, write_report
from .machine import load_lines, machine_title, stamped
from .passthrough import PASSTHROUGH, passthrough_inputs, write_passthrough
from .perf_analyzer import PerfAnalyzerUnavailable, install

__all__ = ["ReferenceConfig", "markdown_table", "reference_config", "run_reference_bench",
           "run_reference_command", "tritonmodel_task"]

logger = logging.getLogger(__name__)

#: perf_analyzer's (protocol, shared memory) for each transport kind of TritonModel
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


def reference_config(models: list[str] | None, transports: list[str] | None,
                     quick: bool = False, batches: list[int] | None = None,
                     concurrency: list[int] | None = None,
                     window_s: float | None = None) -> ReferenceConfig:
    """The run the command line asks for (``quick``: one batch, concurrency 1 and 2, 3 s windows).

    >>> reference_config(["emtrk_cnn"], None, batches=[2048], concurrency=[1, 8]).grid("emtrk_cnn")
    [(2048, 1), (2048, 8)]
    """
    config = ReferenceConfig()
    config.models = tuple(models) if models else config.models
    config.transports = tuple(transports) if transports else config.transports
    if quick:
        config.concurrencies = (1, 2)
        config.batches = {name: sizes[-1:] for name, sizes in config.batches.items()}
        config.window_s = 3.0
    if batches:
        config.batches = {name: tuple(batches) for name in config.models}
    config.concurrencies = tuple(concurrency) if concurrency else config.concurrencies
    config.window_s = window_s or config.window_s
    return config


def tritonmodel_task(task: dict, tasks: Any, control: Any, cache: dict) -> dict:
    """A client process' window (see :class:`~coffea_sonic.bench.clients.ClientPool`): calls of
    ``task["rows"]`` rows back to back on a default TritonModel for ``task["duration"]`` s."""
    from ..model import TritonModel
    from ..transport.shm.select import forget_probes

    # fresh transports and model per window: perf_analyzer unregisters every shared-memory region
    # of the server when it ends (ours too); re-registering them is not what a window measures
    previous = cache.pop("model", None)
    if previous is not None:
        previous.close()
    fresh_clients()
    forget_probes()
    key = (task["model"], task["rows"])
    if key not in cache:
        cache[key] = (passthrough_inputs(task["rows"]) if task["model"] == PASSTHROUGH
                      else zoo.example_inputs(task["model"], task["rows"]))
    inputs = cache[key]
    model = cache["model"] = TritonModel(task["url"], transport=task["transport"],
                                         **task.get("options", {}))
    for _ in range(3):  # connections, shared-memory regions, the server's first batches
        model(inputs)
    seconds, elapsed = timed_calls(lambda _: model(inputs), ready_then_start(tasks, control),
                                   task["duration"])
    return {"rows_per_s": len(seconds) * task["rows"] / max(elapsed, 1e-9), "calls": len(seconds),
            "transport_used": model.transport_kind}


def _measure_row(config: ReferenceConfig, pool: ClientPool, analyzer: Any, analyzer_error: str,
                 model: str, transport: str, addresses: tuple[str, str],
                 output_bytes: Any) -> dict:
    """One model x transport: a TritonModel window first and after every perf_analyzer point."""
    grpc_address, http_address = addresses
    row: dict[str, Any] = {"model": model, "transport": transport,
                           "call_rows": config.call_rows_for(model), "pa_points": [],
                           "pa_best": None, "pa_error": "", "tm_windows": [],
                           "tm_transport_used": "", "tm_error": ""}
    url = (f"triton+http://{http_address}/{model}" if transport == "http"
           else f"triton+grpc://{grpc_address}/{model}")
    task = {"url": url, "transport": transport, "rows": row["call_rows"], "model": model,
            "duration": config.window_s}

    def window() -> None:
        (result,) = pool.run(task, 1)[1]
        if "error" in result:
            row["tm_error"] = result["error"]
        else:
            row["tm_windows"].append(result["rows_per_s"])
            row["tm_transport_used"] = result["transport_used"]

    window()
    protocol, shared = PA_TRANSPORTS[transport]
    for batch, concurrency in config.grid(model) if analyzer is not None else ():
        point = analyzer.measure(model, http_address if protocol == "http" else grpc_address,
                                 protocol, batch, concurrency, shared, output_bytes(batch),
                                 config.pa_window_ms)
        row["pa_points"].append(asdict(point))
        logger.info("%s %s perf_analyzer b=%d c=%d: %.3g rows/s %s", model, transport, batch,
                    concurrency, point.rows_per_s, point.error)
        if not row["tm_error"]:
            window()
    if analyzer is None:
        row["pa_error"] = analyzer_error
        if not row["tm_error"]:
            window()
    good = [p for p in row["pa_points"] if p["rows_per_s"] > 0]
    row["pa_best"] = max(good, key=lambda p: p["rows_per_s"], default=None)
    if not good and row["pa_points"]:
        row["pa_error"] = "; ".join(sorted({p["error"] for p in row["pa_points"]}))[:600]
    row["tm_best"] = max(row["tm_windows"], default=0.0)
    row["ratio"] = (row["tm_best"] / row["pa_best"]["rows_per_s"]
                    if row["pa_best"] and row["tm_windows"] and not row["tm_error"] else None)
    return row


def _output_bytes(model: Any, batch: int) -> int:
    """Bytes of one perf_analyzer request's outputs (its output shared-memory regions' size)."""
    import numpy as np

    return sum(batch * math.prod(max(d, 1) for d in tensor.dims) * np.dtype(tensor.dtype).itemsize
               for tensor in model.info.outputs)


def _rate(value: float | None) -> str:
    return f"{value / 1e6:.2f} M" if value else "–"


def markdown_table(rows: list[dict]) -> str:
    """The report's table: TritonModel's best window, perf_analyzer's best point, the ratio."""
    return "\n".join(table(["model", "transport", "rows per call", "TritonModel (rows/s)",
                            "perf_analyzer best (rows/s)", "ratio"], map(_cells, rows)))


def _cells(row: dict) -> list:
    best = row["pa_best"]
    pa = (f"{_rate(best['rows_per_s'])} (b {best['batch']}, c {best['concurrency']})"
          if best else f"– ({row['pa_error'][:80]})")
    tm = _rate(row["tm_best"]) if not row["tm_error"] else f"– ({row['tm_error'][:80]})"
    if row["tm_transport_used"] and row["tm_transport_used"] != row["transport"]:
        tm += f" (used {row['tm_transport_used']})"
    ratio = f"**{row['ratio']:.2f}x**" if row["ratio"] is not None else "–"
    return [row["model"], row["transport"], row["call_rows"], tm, pa, ratio]


def _page(results: dict) -> str:
    text = [f"# TritonModel at defaults vs perf_analyzer ({machine_title(results['machine'])})", "",
            *load_lines(results), markdown_table(results["rows"]), ""]
    if results.get("perf_analyzer_error"):
        text += [f"perf_analyzer not run: {results['perf_analyzer_error']}", ""]
    return "\n".join(text)


def _write(results: dict, output: Path) -> None:
    """results.json, results.md and (with rows) reference.png: best rates side by side."""
    write_report(results, output, "results", _page)
    rows = results["rows"]
    if not rows:
        return
    figure, axis = pyplot().subplots(figsize=(max(5, 1.4 * len(rows)), 4))
    xs = range(len(rows))
    axis.bar([x - 0.2 for x in xs], [(r["pa_best"] or {}).get("rows_per_s", 0) / 1e6 for r in rows],
             0.4, label="perf_analyzer best")
    axis.bar([x + 0.2 for x in xs], [r["tm_best"] / 1e6 for r in rows], 0.4,
             label="TritonModel at defaults")
    for x, row in zip(xs, rows):
        if row["ratio"] is not None:
            axis.annotate(f"{row['ratio']:.2f}x", (x + 0.2, row["tm_best"] / 1e6),
                          ha="center", va="bottom", fontsize=8)
    axis.set_xticks(list(xs), [f"{row['model']}\n{row['transport']}" for row in rows], fontsize=8)
    axis.set_ylabel("M rows/s")
    axis.set_title(machine_title(results["machine"]), fontsize=9)
    axis.legend(fontsize=8)
    save_figure(figure, output / "reference.png")


@contextlib.contextmanager
def _served(model: str, server: str | None, device: str) -> Iterator[tuple[str, str]]:
    """(gRPC address, HTTP address) of a server with ``model``: ``server`` or one started here."""
    from ..server.launcher import LocalTritonServer

    if server is not None:
        grpc_address, _, http_address = server.partition(",")
        yield grpc_address, http_address
        return
    if model == PASSTHROUGH:
        repository = write_passthrough(Path(tempfile.mkdtemp(prefix="coffea-sonic-passthrough-")))
        started = LocalTritonServer(repository=repository, device="cpu")
    else:
        started = LocalTritonServer(models=[model], device=device)
    with started:
        yield started.grpc_address, started.http_address


def run_reference_bench(config: ReferenceConfig, output_dir: str | Path, server: str | None = None,
                        device: str = "auto") -> dict:
    """Measure every model x transport of ``config``; write and return the results."""
    from ..model import TritonModel

    output = Path(output_dir)
    try:
        analyzer, error = install(), ""
    except PerfAnalyzerUnavailable as unavailable:
        analyzer, error = None, str(unavailable)
        logger.warning("perf_analyzer rows left out: %s", error)
    pool = ClientPool(1, tritonmodel_task)
    with stamped(config=config.__dict__, rows=[], perf_analyzer_error=error) as results:
        try:
            for model in config.models:
                with _served(model, server, device) as addresses:
                    probe = TritonModel(f"triton+grpc://{addresses[0]}/{model}", transport="grpc")
                    for transport in config.transports:
                        results["rows"].append(_measure_row(
                            config, pool, analyzer, error, model, transport, addresses,
                            lambda batch, probe=probe: _output_bytes(probe, batch)))
                        _write(results, output)
                    probe.close()
        finally:
            pool.close()
    _write(results, output)
    return results


def run_reference_command(models: list[str] | None, transports: list[str] | None, quick: bool,
                          output: str, server: str | None, device: str | None,
                          **grid: Any) -> int:
    """``coffea-sonic bench reference``: print the table and where the files are."""
    config = reference_config(models, transports, quick, **grid)
    results = run_reference_bench(config, output, server=server, device=device or "auto")
    print(markdown_table(results["rows"]))
    if results["perf_analyzer_error"]:
        print(f"perf_analyzer not run: {results['perf_analyzer_error']}")
    print(f"  results: {Path(output) / 'results.json'}, results.md, reference.png")
    return 0
