"""The table and figure of ``coffea-sonic bench transport`` (:mod:`.transport_bench`'s report).

:func:`write_transport_report` writes ``results-TAG.json``, ``results-TAG.md`` and
``transport-TAG.png``; :func:`replot` re-draws the table and figure of a written JSON (no numbers
typed in by hand). The figure has one panel per model: each window's rows/s (payload GB/s for
``payload_sink``, where only the transport works), with the ratio to the in-process engine at the
same request size where the run has one.

>>> record = {"kind": "shm", "model": "payload_sink", "rows": 2048, "procs": 1, "in_flight": 2,
...           "rows_per_s": 390000, "gb_per_s": 3.594, "client_submit_ms": 1.2,
...           "latency_ms_p50": 5.0, "gpu_util": None, "errors": [],
...           "server": {"queue_ms": 0.1, "compute_input_ms": 2.0, "compute_infer_ms": 1.0,
...                      "compute_output_ms": 0.1, "avg_batch": 2048.0}}
>>> table_row(record)
'| shm | payload_sink | 2048 | 1 x 2 | 390 k | 3.594 | – | 1.2 | 5 | 0.1 / 2 / 1 / 0.1 | 2048.0 |'
"""

from __future__ import annotations

import json
from pathlib import Path

from .files import pyplot, save_figure, write_report
from .machine import machine_label
from .report import format_rate
from .slice_model import SINK_NAME

__all__ = ["label", "markdown", "plot", "replot", "table_row", "write_transport_report"]

_HEADER = ("| transport | model | rows/request | procs x in flight | rows/s | GB/s | GPU % | "
           "client submit ms | p50 ms | server queue / in / infer / out ms | avg batch |")


def _measured(records: list[dict]) -> list[dict]:
    """Records with a rate (an older study's ``verify`` rows and failed windows have none)."""
    return [record for record in records if record.get("rows_per_s")]


def label(record: dict) -> str:
    """``kind rows x procs x in-flight`` (with an older study's phase in front).

    >>> label({"kind": "grpc", "rows": 512, "procs": 2, "in_flight": 4})
    'grpc 512 rows, 2 x 4'
    """
    return f"{_kind(record)} {record['rows']} rows, {record['procs']} x {record['in_flight']}"


def _kind(record: dict) -> str:
    return f"{record['phase']}: {record['kind']}" if record.get("phase") else record["kind"]


def _round(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def table_row(record: dict) -> str:
    """One markdown row: rates, client and server times of a window."""
    server = record.get("server") or {}
    profile = " / ".join(_round(server.get(f"{part}_ms")) for part in
                         ("queue", "compute_input", "compute_infer", "compute_output"))
    return (f"| {_kind(record)} | {record['model']} | {record['rows']} | {record['procs']} x "
            f"{record['in_flight']} | {format_rate(record['rows_per_s'])} | {record['gb_per_s']} | "
            f"{_round(record.get('gpu_util'))} | {_round(record.get('client_submit_ms'))} | "
            f"{_round(record.get('latency_ms_p50'))} | {profile if server else '–'} | "
            f"{server.get('avg_batch', '–')} |")


def _where(report: dict) -> str:
    machine = report.get("machine", {})
    return (f"{machine_label(machine)} ({machine.get('cpu_model', '?')}, "
            f"{machine.get('cpu_cores', '?')} cores), {machine.get('date', '')[:10]}")


def markdown(report: dict) -> str:
    """The machine, load, command and one row per window (failed windows with their error)."""
    lines = [f"# Transports: rows/s and GB/s per window, {_where(report)}", "",
             f"device {report.get('device')}, {report.get('instances')} model instance(s), "
             f"staging {report.get('staging')}, "
             f"{report.get('duration', report.get('duration_s'))} s per window", "",
             f"load: before `{report.get('uptime_before', '')}`, after "
             f"`{report.get('uptime_after', '')}`", "",
             f"command: `{report.get('command', '')}`", "", _HEADER,
             "|" + "---|" * _HEADER.count(" | ") + "---|"]
    for record in report["records"]:
        if record.get("rows_per_s"):
            lines.append(table_row(record))
        elif record.get("errors"):
            lines.append(f"| {record.get('kind')} | {record.get('model')} | {record.get('rows')} |"
                         f" ERROR: {'; '.join(record['errors'])[:300]} |")
    return "\n".join(lines) + "\n"


def _local_rate(records: list[dict], record: dict) -> float | None:
    for other in records:
        if other["kind"] == "local" and other["model"] == record["model"] \
                and other["rows"] == record["rows"]:
            return other["rows_per_s"]
    return None


def _panel(axis, records: list[dict], model: str) -> None:
    """Bars of one model's windows: GB/s for the sink, else rows/s (x in-process)."""
    mine = [record for record in records if record["model"] == model]
    sink = model == SINK_NAME
    values = [record["gb_per_s"] if sink else record["rows_per_s"] for record in mine]
    axis.barh(range(len(mine)), values,
              color=["#b0b0b0" if r["kind"] in ("local", "tritonclient") else "#3b75af"
                     for r in mine])
    for index, record in enumerate(mine):
        local = _local_rate(records, record)
        text = (f"{record['gb_per_s']:.2f} GB/s" if sink else format_rate(record["rows_per_s"]))
        if local and record["kind"] != "local":
            text += f", {record['rows_per_s'] / local:.2f}x in-process"
        if record.get("gpu_util") is not None:
            text += f", GPU {record['gpu_util']:.0f}%"
        axis.text(values[index], index, " " + text, va="center", fontsize=7)
    axis.set_yticks(range(len(mine)), [label(record) for record in mine], fontsize=7)
    axis.invert_yaxis()
    axis.margins(x=0.3)  # room for the labels right of the bars
    axis.set_xlabel("tensor payload GB/s (transport-bound model)" if sink else "rows/s")
    axis.set_title(model, fontsize=9)


def plot(report: dict, path: str | Path) -> Path:
    """One panel per model of the report's windows, written to ``path``."""
    plt = pyplot()
    records = _measured(report["records"])
    models = sorted({record["model"] for record in records}, key=lambda m: (m != SINK_NAME, m))
    figure, axes = plt.subplots(len(models) or 1, 1, squeeze=False,
                                figsize=(9, 1.2 + 0.35 * max(len(records), 2)))
    for axis, model in zip(axes[:, 0], models):
        _panel(axis, records, model)
    return save_figure(figure, path, f"{_where(report)}; device {report.get('device')}")


def write_transport_report(report: dict, output: str | Path, tag: str) -> dict[str, Path]:
    """``results-TAG.json``, ``results-TAG.md`` and ``transport-TAG.png`` in ``output``."""
    output = Path(output)
    write_report(report, output, f"results-{tag}", markdown)
    return {"json": output / f"results-{tag}.json", "markdown": output / f"results-{tag}.md",
            "figure": plot(report, output / f"transport-{tag}.png")}


def replot(source: str | Path, output: str | Path) -> dict[str, Path]:
    """The table and figure of a written ``results-TAG.json``, into ``output`` (same TAG)."""
    source = Path(source)
    report = json.loads(source.read_text())
    tag = source.stem.removeprefix("results-")
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    (output / f"results-{tag}.md").write_text(markdown(report))
    return {"markdown": output / f"results-{tag}.md",
            "figure": plot(report, output / f"transport-{tag}.png")}
