"""The tables and figure of ``coffea-sonic bench wrapper`` (:mod:`.wrapper`'s results).
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from .files import cell, pyplot, save_figure, table, write_report
from .report import format_rate

__all__ = ["markdown", "write_wrapper"]

_PARTS = ("compute_input", "compute_infer", "compute_output")


def _comparison_row(row: dict[str, Any]) -> list[Any]:
    if "error" in row:
        return [row["client"], *["–"] * 6, f"not measured: {row['error']}"]
    ratio, paired = row.get("ratio_to_wrapper"), row.get("ratio_to_wrapper_paired_median")
    requests = row.get("sent", {}).get("requests_per_call")
    server = row.get("server", {})
    parts = " / ".join(f"{server.get(f'{part}_ms_per_call', 0):.1f}" for part in _PARTS)
    return [row["client"], format_rate(row["rows_per_s_median"]),
            f"{format_rate(row['rows_per_s_p25'])}–{format_rate(row['rows_per_s_p75'])}",
            f"{row['ms_per_call_median']:.1f}", f"**{ratio:.2f}x**" if ratio else "–",
            f"{paired:.2f}x" if paired else "–", cell(requests, "g"),
            f"{server['request_ms_per_call']:.1f} ({parts})" if server else "–"]


def _serial_row(transport: str, row: dict[str, Any] | str) -> list[Any]:
    if isinstance(row, str):
        return [transport, row, "", "", "", ""]
    return [transport, f"{row['wall_ms_per_call']:.1f}", f"{row['server_request_ms_per_call']:.1f}",
            " / ".join(f"{row[f'server_{part}_ms_per_call']:.1f}" for part in _PARTS),
            f"{row['outside_server_ms_per_call']:.1f}", f"{row['requests_per_call']:.0f}"]


def _sweep_grid(records: list[dict[str, Any]], transport: str
                ) -> tuple[list[float], list[int], np.ndarray]:
    """Request sizes (MiB), windows and the median rows/s of each (NaN: not measured)."""
    mine = [r for r in records if r["transport"] == transport]
    sizes = sorted({r["max_request_mib"] for r in mine})
    windows = sorted({r["max_in_flight"] for r in mine})
    grid = np.full((len(sizes), len(windows)), np.nan)
    for r in mine:
        grid[sizes.index(r["max_request_mib"]), windows.index(r["max_in_flight"])] = \
            r["rows_per_s_median"]
    return sizes, windows, grid


def _sweep_tables(records: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for transport in sorted({r["transport"] for r in records}):
        sizes, windows, grid = _sweep_grid(records, transport)
        lines += [f"**{transport}** (rows/s, median)", "", *table(
            ["max_request_bytes \\ max_in_flight", *windows],
            ([f"{size:g} MiB", *(format_rate(v) if np.isfinite(v) else "–" for v in values)]
             for size, values in zip(sizes, grid))), ""]
    return lines


def _run_section(run: dict[str, Any]) -> list[str]:
    config = run["config"]
    lines = [f"## max_batch_size {config['max_batch_size']}, dynamic batching "
             f"{'on' if config['dynamic_batching'] else 'off'}, {config['rounds']} calls "
             "per client", "", *table(
                 ["client", "rows/s (median)", "p25–p75", "ms/call", "vs wrapper (medians)",
                  "vs wrapper (paired per round)", "requests/call",
                  "server ms/call: request (input / infer / output)"],
                 map(_comparison_row, run["comparison"]))]
    if run.get("serial_breakdown"):
        lines += ["", "One request in flight (``max_in_flight=1``), ms per call:", "", *table(
            ["transport", "wall", "inside Triton (request)", "of which input / infer / output",
             "outside Triton (client + gRPC)", "requests"],
            (_serial_row(t, row) for t, row in run["serial_breakdown"].items()))]
    if run.get("sweep"):
        lines += ["", "TritonModel knobs (``max_request_bytes`` x ``max_in_flight``):", ""]
        lines += _sweep_tables(run["sweep"])
    return lines + [""]


def markdown(results: dict[str, Any]) -> str:
    """Every table of the run as Markdown: comparison per server config, steps."""
    env, rows = results["environment"], results["workload"]["rows"]
    lines = [f"# TritonModel vs coffea's triton_wrapper, transport-bound model ({env['date']})",
             "", f"{env['cpu_count']} cores ({env['cpu_model']}): load average "
             f"{env['load_before']} before, {env.get('load_after', '?')} after. {rows:,} rows per "
             f"call of 16 FP32 -> 2 FP32 ({rows * 64 / 1e6:.1f} MB in, {rows * 8 / 1e6:.1f} MB "
             "out), one python-backend instance, loopback; clients take turns call by call.", "",
             f"command: `{env.get('command', '')}`", ""]
    for run in results["runs"]:
        lines += _run_section(run)
    steps = results.get("client_steps", {})
    if steps:
        lines += [f"Client-side steps for one {steps['piece_rows']}-row request "
                  f"({steps['piece_bytes'] / (1 << 20):.1f} MiB) in isolation, best of 15, ms:",
                  ""]
        lines += [f"- {key}: {value:.2f}" if isinstance(value, float) else f"- {key}: {value}"
                  for key, value in steps.items() if key not in ("piece_rows", "piece_bytes")]
    return "\n".join(lines) + "\n"


def _bars(axis: Any, runs: list[dict[str, Any]], rows: int) -> None:
    """rows/s per client (p25-p75 bars), one colour per server config, ratios on top."""
    names = [r["client"] for r in runs[0]["comparison"] if "error" not in r]
    width = 0.8 / len(runs)
    for index, run in enumerate(runs):
        by_name = {r["client"]: r for r in run["comparison"] if "error" not in r}
        got = [by_name.get(n) for n in names]
        positions = np.arange(len(names)) + (index - (len(runs) - 1) / 2) * width
        values = np.array([r["rows_per_s_median"] / 1e6 if r else np.nan for r in got])
        spread = np.array([[r["rows_per_s_median"] - r["rows_per_s_p25"],
                            r["rows_per_s_p75"] - r["rows_per_s_median"]] if r else [0, 0]
                           for r in got]).T / 1e6
        axis.bar(positions, values, width, yerr=spread, capsize=2,
                 label=f"max_batch_size {run['config']['max_batch_size']}")
        for x, r, value in zip(positions, got, values):
            if r and r.get("ratio_to_wrapper"):
                axis.text(x, value, f"{r['ratio_to_wrapper']:.1f}x", ha="center", va="bottom",
                          fontsize=7)
    axis.set_xticks(range(len(names)), [textwrap.fill(n, 13) for n in names], fontsize=7)
    axis.set_ylabel("M rows/s (median; bars p25-p75)")
    axis.set_title(f"{rows:,} rows per call, clients at defaults")
    axis.legend(fontsize=8)


def _heat_map(figure: Any, axis: Any, records: list[dict[str, Any]], transport: str,
              max_batch_size: int) -> None:
    sizes, windows, grid = _sweep_grid(records, transport)
    image = axis.imshow(grid / 1e6, origin="lower", aspect="auto", cmap="viridis")
    for (i, j), value in np.ndenumerate(grid / 1e6):
        if np.isfinite(value):
            axis.text(j, i, f"{value:.1f}", ha="center", va="center", color="w", fontsize=8)
    axis.set_xticks(range(len(windows)), [str(w) for w in windows])
    axis.set_yticks(range(len(sizes)), [f"{s:g}" for s in sizes])
    axis.set(xlabel="max_in_flight", ylabel="max_request_bytes (MiB)")
    axis.set_title(f"TritonModel {transport}, max_batch_size {max_batch_size}: M rows/s",
                   fontsize=10)
    figure.colorbar(image, ax=axis)


def write_wrapper(results: dict[str, Any], out: str | Path) -> str:
    """results.json, results.md and wrapper_vs_tritonmodel.png in ``out``; returns the tables.

    >>> import tempfile
    >>> write_wrapper({"environment": {"date": "today", "cpu_count": 2, "cpu_model": "cpu",
    ...     "load_before": "0"}, "workload": {"rows": 4}, "runs": [{"config": {
    ...     "max_batch_size": 8, "dynamic_batching": False, "rounds": 1}, "comparison": [
    ...     {"client": "grpc", "rows_per_s_median": 4.0, "rows_per_s_p25": 3.0,
    ...      "rows_per_s_p75": 5.0, "ms_per_call_median": 1.0}]}]},
    ...     tempfile.mkdtemp()).splitlines()[-2]
    '| grpc | 4 | 3–5 | 1.0 | – | – | – | – |'
    """
    text = write_report(results, out, "results", markdown)
    runs = results["runs"]
    swept = [run for run in runs if run.get("sweep")]
    records = [r for run in swept for r in run["sweep"]]
    transports = sorted({r["transport"] for r in records})
    figure, axes = pyplot().subplots(1, 1 + len(transports),
                                     figsize=(7 + 5 * len(transports), 5), squeeze=False)
    _bars(axes[0][0], runs, results["workload"]["rows"])
    for axis, transport in zip(axes[0][1:], transports):
        _heat_map(figure, axis, records, transport, swept[0]["config"]["max_batch_size"])
    env = results["environment"]
    save_figure(figure, Path(out) / "wrapper_vs_tritonmodel.png",
                f"{env['cpu_count']}-core CPU, {env['date']}, load before {env['load_before']}")
    return text
