"""``coffea-sonic bench reference``: run :mod:`.reference` on this machine and write its report.

Per model a server is started (the embedded one at its defaults; the ``passthrough`` model from
its own repository) unless ``server`` names one that serves every model. perf_analyzer is
installed on demand (:func:`.perf_analyzer.install`); where that fails, the report says why and
TritonModel's rows are still measured. Writes ``results.json``, ``results.md`` and
``reference.png`` into the output folder.

>>> markdown_table([{"model": "m", "transport": "grpc", "call_rows": 8, "tm_best": 2e6,
...     "tm_transport_used": "grpc", "pa_best": {"rows_per_s": 4e6, "batch": 8, "concurrency": 2},
...     "ratio": 0.5, "pa_error": "", "tm_error": ""}]).splitlines()[2]
'| m | grpc | 8 | 2.00 M | 4.00 M (b 8, c 2) | **0.50x** |'
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .clients import ClientPool
from .files import pyplot, save_figure, write_report
from .machine import machine_info
from .passthrough import PASSTHROUGH, write_passthrough
from .perf_analyzer import PerfAnalyzerUnavailable, install
from .reference import ReferenceConfig, ReferenceRun, output_bytes, tritonmodel_task

__all__ = ["markdown_table", "run_reference_bench", "uptime_line"]

logger = logging.getLogger(__name__)


def _rate(value: float | None) -> str:
    return f"{value / 1e6:.2f} M" if value else "–"


def markdown_table(rows: list[dict]) -> str:
    """The report's table: TritonModel's best window, perf_analyzer's best point, the ratio."""
    lines = ["| model | transport | rows per call | TritonModel (rows/s) | perf_analyzer best "
             "(rows/s) | ratio |", "|---|---|---|---|---|---|"]
    for row in rows:
        best = row["pa_best"]
        pa = (f"{_rate(best['rows_per_s'])} (b {best['batch']}, c {best['concurrency']})"
              if best else f"– ({row['pa_error'][:80]})")
        tm = _rate(row["tm_best"]) if not row["tm_error"] else f"– ({row['tm_error'][:80]})"
        if row["tm_transport_used"] and row["tm_transport_used"] != row["transport"]:
            tm += f" (used {row['tm_transport_used']})"
        ratio = f"**{row['ratio']:.2f}x**" if row["ratio"] is not None else "–"
        lines.append(f"| {row['model']} | {row['transport']} | {row['call_rows']} | {tm} | "
                     f"{pa} | {ratio} |")
    return "\n".join(lines)


def _plot(rows: list[dict], path: Path, title: str) -> None:
    labels = [f"{row['model']}\n{row['transport']}" for row in rows]
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
    axis.set_xticks(list(xs), labels, fontsize=8)
    axis.set_ylabel("M rows/s")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=8)
    save_figure(figure, path)


def uptime_line() -> str:
    """``uptime``'s line (the machine's load beside a figure), or "" where it cannot run."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except OSError:
        return ""


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
    output.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine_info(), "uptime_before": uptime_line(),
                               "config": config.__dict__, "rows": []}
    try:
        analyzer, error = install(), ""
    except PerfAnalyzerUnavailable as unavailable:
        analyzer, error = None, str(unavailable)
        logger.warning("perf_analyzer rows left out: %s", error)
    results["perf_analyzer_error"] = error
    pool = ClientPool(1, tritonmodel_task)
    try:
        run = ReferenceRun(config, pool, analyzer, error)
        for model in config.models:
            with _served(model, server, device) as (grpc_address, http_address):
                probe = TritonModel(f"triton+grpc://{grpc_address}/{model}", transport="grpc")
                sizes = lambda batch, probe=probe: output_bytes(probe, batch)  # noqa: E731
                for transport in config.transports:
                    row = run.measure(model, transport, grpc_address, http_address, sizes)
                    results["rows"].append(row.to_dict())
                    _write(results, output)
                probe.close()
    finally:
        pool.close()
    results["uptime_after"] = uptime_line()
    _write(results, output)
    return results


def _title(results: dict) -> str:
    machine = results["machine"]
    return (f"{machine.get('cpu_model', '')}, {machine.get('cpu_cores')} cores"
            f"{', ' + machine['gpus'][0] if machine.get('gpus') else ''}, {machine['date']}")


def _page(results: dict) -> str:
    text = [f"# TritonModel at defaults vs perf_analyzer ({_title(results)})", "",
            f"load: before `{results['uptime_before']}`, after `{results.get('uptime_after', '')}`",
            "", markdown_table(results["rows"]), ""]
    if results.get("perf_analyzer_error"):
        text += [f"perf_analyzer not run: {results['perf_analyzer_error']}", ""]
    return "\n".join(text)


def _write(results: dict, output: Path) -> None:
    write_report(results, output, "results", _page)
    if results["rows"]:
        _plot(results["rows"], output / "reference.png", _title(results))


def reference_config(models: list[str] | None, transports: list[str] | None,
                     quick: bool = False, batches: list[int] | None = None,
                     concurrency: list[int] | None = None,
                     window_s: float | None = None) -> ReferenceConfig:
    """The run the command line asks for (``quick``: one batch, concurrency 1 and 2, 3 s windows).

    >>> reference_config(None, ["grpc"], quick=True).grid("passthrough")
    [(65536, 1), (65536, 2)]
    >>> reference_config(["emtrk_cnn"], None, batches=[2048], concurrency=[1, 8]).grid("emtrk_cnn")
    [(2048, 1), (2048, 8)]
    """
    config = ReferenceConfig()
    if models:
        config.models = tuple(models)
    if transports:
        config.transports = tuple(transports)
    if quick:
        config.concurrencies = (1, 2)
        config.batches = {name: batches[-1:] for name, batches in config.batches.items()}
        config.window_s = 3.0
    if batches:
        config.batches = {name: tuple(batches) for name in config.models}
    if concurrency:
        config.concurrencies = tuple(concurrency)
    if window_s:
        config.window_s = window_s
    return config


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
