"""The report of ``bench wrapper``: Markdown tables and the plot of :func:`~.wrapper.run_wrapper`.

:func:`markdown`: per server config the comparison (rows/s, spread, ratio to coffea's wrapper,
Triton's time per call), one request in flight, the sweep; the py-spy profiles and the
client-side steps. :func:`plot`: bars of rows/s per client and server config, the sweep as heat
maps. :func:`write_wrapper` writes results.json, results.md and wrapper_vs_tritonmodel.png.

>>> run = {"config": {"max_batch_size": 8, "dynamic_batching": True, "rounds": 2},
...        "comparison": [{"client": "http", "error": "unreachable"}]}
>>> _comparison_table(run)[-1]
'| http | – | – | – | – | – | – | not measured: unreachable |'
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from .files import pyplot, save_figure, write_report
from .report import format_rate

__all__ = ["markdown", "plot", "write_wrapper"]

MiB = 1 << 20


def _server_cell(server: dict[str, Any]) -> str:
    if not server:
        return "–"
    return (f"{server['request_ms_per_call']:.1f} ({server['compute_input_ms_per_call']:.1f} / "
            f"{server['compute_infer_ms_per_call']:.1f} / "
            f"{server['compute_output_ms_per_call']:.1f})")


def _comparison_table(run: dict[str, Any]) -> list[str]:
    lines = ["| client | rows/s (median) | p25–p75 | ms/call | vs wrapper (medians) | vs wrapper "
             "(paired per round) | requests/call | server ms/call: request (input / infer / "
             "output) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in run["comparison"]:
        if "error" in row:
            lines.append(f"| {row['client']} | – | – | – | – | – | – | not measured: "
                         f"{row['error']} |")
            continue
        ratio = row.get("ratio_to_wrapper")
        paired = row.get("ratio_to_wrapper_paired_median")
        requests = row.get("sent", {}).get("requests_per_call")
        lines.append(
            f"| {row['client']} | {format_rate(row['rows_per_s_median'])} | "
            f"{format_rate(row['rows_per_s_p25'])}–{format_rate(row['rows_per_s_p75'])} | "
            f"{row['ms_per_call_median']:.1f} | {f'**{ratio:.2f}x**' if ratio else '–'} | "
            f"{f'{paired:.2f}x' if paired else '–'} | "
            f"{f'{requests:g}' if requests is not None else '–'} | "
            f"{_server_cell(row.get('server', {}))} |")
    return lines


def _serial_table(serial: dict[str, Any]) -> list[str]:
    lines = ["| transport | wall | inside Triton (request) | of which input / infer / output | "
             "outside Triton (client + gRPC) | requests |", "|---|---|---|---|---|---|"]
    for transport, row in serial.items():
        if isinstance(row, str):
            lines.append(f"| {transport} | {row} | | | | |")
            continue
        lines.append(
            f"| {transport} | {row['wall_ms_per_call']:.1f} | "
            f"{row['server_request_ms_per_call']:.1f} | "
            f"{row['server_compute_input_ms_per_call']:.1f} / "
            f"{row['server_compute_infer_ms_per_call']:.1f} / "
            f"{row['server_compute_output_ms_per_call']:.1f} | "
            f"{row['outside_server_ms_per_call']:.1f} | {row['requests_per_call']:.0f} |")
    return lines


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
        lines += [f"**{transport}** (rows/s, median)", "",
                  "| max_request_bytes \\ max_in_flight | " + " | ".join(map(str, windows)) + " |",
                  "|---|" + "---|" * len(windows)]
        for size, values in zip(sizes, grid):
            cells = [format_rate(v) if np.isfinite(v) else "–" for v in values]
            lines.append(f"| {size:g} MiB | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _run_section(run: dict[str, Any]) -> list[str]:
    config = run["config"]
    lines = [f"## max_batch_size {config['max_batch_size']}, dynamic batching "
             f"{'on' if config['dynamic_batching'] else 'off'}, {config['rounds']} calls "
             "per client", ""]
    lines += _comparison_table(run)
    if run.get("serial_breakdown"):
        lines += ["", "One request in flight (``max_in_flight=1``), ms per call:", ""]
        lines += _serial_table(run["serial_breakdown"])
    if run.get("sweep"):
        lines += ["", "TritonModel knobs (``max_request_bytes`` x ``max_in_flight``):", ""]
        lines += _sweep_tables(run["sweep"])
    return lines + [""]


def _profile_section(client_name: str, profile: dict[str, Any]) -> list[str]:
    lines = [f"py-spy, calling thread of ``{client_name}`` ({profile['ms_per_call']:.1f} ms per "
             f"call while sampled), share of its samples, inclusive:", ""]
    # frames under which (nearly) every sample lies (the loop, __call__) say nothing
    telling = [(name, share) for name, share in profile["inclusive"] if share < 0.95]
    lines += [f"- {share:.0%} {name}" for name, share in telling[:8]]
    lines += ["", "self:", ""]
    lines += [f"- {share:.0%} {name}" for name, share in profile["self"][:8]]
    return lines + [""]


def markdown(results: dict[str, Any]) -> str:
    """Every table of the run as Markdown: comparison per server config, profile, sweep."""
    env, workload = results["environment"], results["workload"]
    rows = workload["rows"]
    lines = [f"# TritonModel vs coffea's triton_wrapper, transport-bound model ({env['date']})",
             "", f"{env['cpu_count']} cores ({env['cpu_model']}): load average "
             f"{env['load_before']} before, {env.get('load_after', '?')} after. {rows:,} rows per "
             f"call of 16 FP32 -> 2 FP32 ({rows * 64 / 1e6:.1f} MB in, {rows * 8 / 1e6:.1f} MB "
             "out), one python-backend instance, loopback; clients take turns call by call.", "",
             f"command: `{env.get('command', '')}`", ""]
    for run in results["runs"]:
        lines += _run_section(run)
    for client_name, profile in results.get("profiles", {}).items():
        lines += _profile_section(client_name, profile)
    steps = results.get("client_steps", {})
    if steps:
        lines += [f"Client-side steps for one {steps['piece_rows']}-row request "
                  f"({steps['piece_bytes'] / MiB:.1f} MiB) in isolation, best of 15, ms:", ""]
        lines += [f"- {key}: {value:.2f}" if isinstance(value, float) else f"- {key}: {value}"
                  for key, value in steps.items() if key not in ("piece_rows", "piece_bytes")]
    return "\n".join(lines) + "\n"


def _bars(axis: Any, runs: list[dict[str, Any]], rows: int) -> None:
    """rows/s per client (p25-p75 bars), one colour per server config, ratios on top."""
    names = [r["client"] for r in runs[0]["comparison"] if "error" not in r]
    width = 0.8 / len(runs)
    for index, run in enumerate(runs):
        by_name = {r["client"]: r for r in run["comparison"] if "error" not in r}
        positions = np.arange(len(names)) + (index - (len(runs) - 1) / 2) * width
        values = np.array([by_name[n]["rows_per_s_median"] / 1e6 if n in by_name else np.nan
                           for n in names])
        spread = np.array([[(by_name[n]["rows_per_s_median"] - by_name[n]["rows_per_s_p25"]) / 1e6,
                            (by_name[n]["rows_per_s_p75"] - by_name[n]["rows_per_s_median"]) / 1e6]
                           if n in by_name else [0, 0] for n in names]).T
        axis.bar(positions, values, width, yerr=spread, capsize=2,
                 label=f"max_batch_size {run['config']['max_batch_size']}")
        for x, name, value in zip(positions, names, values):
            ratio = by_name.get(name, {}).get("ratio_to_wrapper")
            if ratio:
                axis.text(x, value, f"{ratio:.1f}x", ha="center", va="bottom", fontsize=7)
    axis.set_xticks(range(len(names)), [textwrap.fill(n, 13) for n in names], fontsize=7)
    axis.set_ylabel("M rows/s (median; bars p25-p75)")
    axis.set_title(f"{rows:,} rows per call, clients at defaults")
    axis.legend(fontsize=8)


def _heat_map(figure: Any, axis: Any, records: list[dict[str, Any]], transport: str,
              max_batch_size: int) -> None:
    sizes, windows, grid = _sweep_grid(records, transport)
    grid = grid / 1e6
    image = axis.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
    for (i, j), value in np.ndenumerate(grid):
        if np.isfinite(value):
            axis.text(j, i, f"{value:.1f}", ha="center", va="center", color="w", fontsize=8)
    axis.set_xticks(range(len(windows)), [str(w) for w in windows])
    axis.set_yticks(range(len(sizes)), [f"{s:g}" for s in sizes])
    axis.set_xlabel("max_in_flight")
    axis.set_ylabel("max_request_bytes (MiB)")
    axis.set_title(f"TritonModel {transport}, max_batch_size {max_batch_size}: M rows/s",
                   fontsize=10)
    figure.colorbar(image, ax=axis)


def plot(results: dict[str, Any], path: Path) -> None:
    """Bars of rows/s per client and server config (ratio to the wrapper on top), sweep heat maps."""
    plt = pyplot()
    runs = results["runs"]
    swept = [run for run in runs if run.get("sweep")]
    records = [r for run in swept for r in run["sweep"]]
    transports = sorted({r["transport"] for r in records})
    figure, axes = plt.subplots(1, 1 + len(transports),
                                figsize=(7 + 5 * len(transports), 5), squeeze=False)
    _bars(axes[0][0], runs, results["workload"]["rows"])
    for axis, transport in zip(axes[0][1:], transports):
        _heat_map(figure, axis, records, transport, swept[0]["config"]["max_batch_size"])
    env = results["environment"]
    save_figure(figure, path,
                f"{env['cpu_count']}-core CPU, {env['date']}, load before {env['load_before']}")


def write_wrapper(results: dict[str, Any], out: str | Path) -> str:
    """results.json, results.md and wrapper_vs_tritonmodel.png in ``out``; returns the tables."""
    text = write_report(results, out, "results", markdown)
    plot(results, Path(out) / "wrapper_vs_tritonmodel.png")
    return text
