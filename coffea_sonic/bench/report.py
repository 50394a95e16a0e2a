"""Write a benchmark result as JSON, a markdown report and PNG plots.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from .config import MODES
from .files import cell, pyplot, save_figure, section, table, write_report
from .machine import machine_label

logger = logging.getLogger(__name__)

#: Files :func:`write_outputs` writes (plots only where there is something to draw).
JSON_NAME, MARKDOWN_NAME = "results.json", "results.md"
BATCH_PLOT, CLIENTS_PLOT, IN_FLIGHT_PLOT, E2E_PLOT = (
    "throughput_vs_batch.png", "throughput_vs_clients.png", "throughput_vs_in_flight.png",
    "e2e_speedup.png")
MODE_COLOURS = {"cpu": "tab:blue", "local-gpu": "tab:green", "remote": "tab:red",
                "remote-sync": "tab:orange", "coffea-wrapper": "tab:gray"}


def _scaled(value: float | None, units: tuple[tuple[float, str, str], ...]) -> str:
    """``value`` over the first ``(scale, unit, spec)`` of ``units`` (largest first) that it
    reaches, the last where it reaches none; ``–`` where None or not finite."""
    if value is None or not math.isfinite(value):
        return "–"
    scale, unit, spec = next((u for u in units if abs(value) >= u[0]), units[-1])
    return f"{value / scale:{spec}}{unit}"


def format_rate(value: float | None) -> str:
    """Human-readable count per second (k, M, G)."""
    return _scaled(value, ((1e9, " G", ".3g"), (1e6, " M", ".3g"), (1e3, " k", ".3g"),
                           (1.0, "", ".3g")))


def format_bytes(value: float | None) -> str:
    return _scaled(value, ((2**30, " GiB", ".1f"), (2**20, " MiB", ".1f"),
                           (2**10, " KiB", ".1f"), (1, " B", ".0f")))


def format_seconds(value: float | None) -> str:
    """Seconds with a unit that keeps three significant digits.

    >>> format_seconds(0.0123), format_seconds(2.5e-6), format_seconds(3.0)
    ('12.3 ms', '2.5 µs', '3 s')
    """
    return _scaled(value, ((1.0, " s", ".3g"), (1e-3, " ms", ".3g"), (1e-6, " µs", ".3g"),
                           (1e-9, " ns", ".3g")))


def _clean(value):
    """JSON-safe copy: numpy scalars to Python, non-finite floats to None, floats to 6 digits.

    >>> _clean({"a": [float("inf"), np.float32(0.1), 1 / 3]})
    {'a': [None, 0.1, 0.333333]}
    """
    if isinstance(value, dict):
        return {str(key): _clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        # six significant digits: far below any repetition spread, a third of the file size
        return float(f"{value:.6g}") if math.isfinite(value) else None
    return value


def _mode_order(mode: str) -> int:
    return MODES.index(mode) if mode in MODES else len(MODES)


def _sorted(records: list[dict]) -> list[dict]:
    return sorted(records, key=lambda r: (r["model"], _mode_order(r["mode"]), r["batch_size"],
                                          r["in_flight"], r["clients"]))


def _sweep(results: dict, sweep: str) -> list[dict]:
    return _sorted([r for r in results["measurements"] if sweep in r.get("sweeps", ())])


def batch_cell(record: dict) -> str:
    """``4096``, or ``default (65536)`` for a mode's own batching (batch_size 0)."""
    if record["batch_size"] == 0:
        effective = record.get("effective_batch")
        return f"default ({effective:.0f})" if effective else "default"
    return str(record["batch_size"])


def _rss_cell(record: dict) -> str:
    rss = record["client_rss"]
    worst = rss.get("worst_ratio_to_tensor_bytes", rss["ratio_to_tensor_bytes"])
    return f"{rss['ratio_to_tensor_bytes']:.2f} (worst {worst:.2f})"


def _rate_cells(record: dict) -> str:
    """``median | min–max`` of a record's rows/s (two table cells)."""
    rate = record["rows_per_s"]
    return f"{format_rate(rate['median'])} | {format_rate(rate['min'])}–{format_rate(rate['max'])}"


def _latency_cell(record: dict) -> str:
    """``p50 / p99`` of a record's latency in ms."""
    latency = record["latency"]
    return f"{cell(latency.get('p50_ms'), '.2f')} / {cell(latency.get('p99_ms'), '.2f')}"


def _server_cell(record: dict) -> str:
    server = record.get("server")
    if not server:
        return "–"
    return (f"{server['queue_ms_per_request']:.2f} / {server['compute_infer_ms_per_request']:.2f}"
            f" (×{server['average_batch']:.0f})")


def markdown_report(results: dict) -> str:
    """The result as markdown: machine, tables per sweep, targets, scaling model, equality."""
    lines = _header_section(results)
    for section in (_batch_section, _in_flight_section, _clients_section, _targets_section,
                    _profile_section, _scaling_section, _equality_section, _e2e_section):
        lines += section(results)
    return "\n".join(lines) + "\n"


def _header_section(results: dict) -> list[str]:
    """Machine, versions, server, preset, partial and skipped runs."""
    machine = results["machine"]
    versions = machine.get("versions", {})
    lines = [
        f"# coffea-sonic bench: {machine_label(machine)}, {machine['date'][:10]}",
        "",
        f"- machine: {machine['cpu_model']}, {machine['cpu_cores']} cores, "
        f"{format_bytes(machine.get('memory_bytes'))}; GPU: "
        f"{'; '.join(machine['gpus']) or 'none'}",
        "- versions: " + ", ".join(f"{name} {version}" for name, version in versions.items()
                                   if version),
        f"- server: {results['server'].get('address', '–')} "
        f"({'embedded tritonserver, ' + str(results['server'].get('device')) if results['server'].get('embedded') else 'external'})"
        if results.get("server") else "- server: none (no served mode)",
        f"- preset {results['config']['preset']}: {results['config']['repetitions']} repetitions "
        f"after {results['config']['warmup']} warm-up chunk(s); median and (min–max) spread; "
        f"run took {results['elapsed_s']:.0f} s",
    ]
    if results.get("partial"):
        lines.append("- **partial run** (stopped before every configuration ran)")
    for skipped in results.get("skipped", []):
        what = ", ".join(f"{key} {value}" for key, value in skipped.items() if key != "reason")
        lines.append(f"- skipped {what}: {skipped['reason']}")
    return lines


def _batch_section(results: dict) -> list[str]:
    """Throughput by mode and batch size (one client process); the table even when empty."""
    header = ["model", "mode", "batch", "in flight", "rows/s", "spread", "events/s",
              "latency p50 / p99 ms", "server queue / compute ms per request (avg batch)",
              "client RSS growth / tensor bytes, median chunk", "max abs diff"]
    rows = [[r["model"], r["mode"], batch_cell(r), r["in_flight"], _rate_cells(r),
             format_rate(r["events_per_s"]["median"]), _latency_cell(r), _server_cell(r),
             _rss_cell(r), cell(r.get("max_abs_diff"), ".1e")]
            for r in _sweep(results, "batch")]
    return ["", "## Throughput by mode and batch size (one client process)", "",
            *table(header, rows, "llrrrrrrrrr")]


def _in_flight_section(results: dict) -> list[str]:
    """Requests in flight (remote, one client)."""
    return section("Requests in flight (remote, one client)",
                   ["model", "batch", "in flight", "rows/s", "spread", "latency p50 / p99 ms",
                    "server queue / compute ms (avg batch)"],
                   ([r["model"], batch_cell(r), r["in_flight"], _rate_cells(r), _latency_cell(r),
                     _server_cell(r)] for r in _sweep(results, "in_flight")), "lrrrrrr")


def _clients_row(r: dict) -> list:
    busy = (r.get("server") or {}).get("busy_fraction")
    gpu = r.get("gpu") or {}
    gpu_cell = ("–" if gpu.get("mean_percent") is None
                else f"{gpu['mean_percent']:.0f} / {gpu['max_percent']:.0f}")
    return [r["model"], r["mode"], batch_cell(r), r["clients"], _rate_cells(r),
            format_rate(r["events_per_s"]["median"]),
            cell(None if busy is None else 100 * busy, ".0f", " %"), gpu_cell, _rss_cell(r)]


def _clients_section(results: dict) -> list[str]:
    """Concurrent client processes."""
    return section("Concurrent client processes",
                   ["model", "mode", "batch", "clients", "aggregate rows/s", "spread", "events/s",
                    "server busy", "GPU util mean / max %", "client RSS growth / tensor bytes, "
                    "median chunk of the worst process"],
                   map(_clients_row, _sweep(results, "clients")), "llrrrrrrrr")


def _target_row(t: dict) -> list:
    goal = "–" if t["target"] is None else (("≤ " if t.get("lower_is_better") else "≥ ")
                                            + f"{t['target']:g}")
    met = {True: "yes", False: "**no**", None: "–"}[t["met"]]
    note = t["detail"] + (f"; {t['shortfall']}" if t.get("shortfall") else "")
    return [t["name"], t["model"], cell(t["measured"], ".2f"), goal, met, note]


def _targets_section(results: dict) -> list[str]:
    """The targets and whether they were met."""
    return section("Targets", ["target", "model", "measured", "goal", "met", "how"],
                   map(_target_row, results.get("targets") or []), "llrr")


def _profile_row(r: dict) -> list:
    p = r["profile"]
    return [r["model"], r["mode"], batch_cell(r), r["in_flight"], r["clients"],
            f"{p['request_mb']:.2f}", cell(p["observed_ms"], ".2f"), cell(p["client_ms"], ".2f"),
            cell(p["wire_and_server_overhead_ms"], ".2f"), cell(p["queue_ms"], ".2f"),
            f"{p['compute_input_ms']:.2f} / {p['compute_infer_ms']:.2f} / "
            f"{p['compute_output_ms']:.2f}", cell(p["observed_gb_per_s"], ".2f")]


def _profile_section(results: dict) -> list[str]:
    """Where the time goes, per request (served modes)."""
    profiled = [r for r in results["measurements"] if r.get("profile")
                and ("in_flight" in r.get("sweeps", ()) or "clients" in r.get("sweeps", ())
                     or r["batch_size"] == 0 or r["mode"] != "remote")]
    return section(
        "Where the time goes (served modes, per request, means)",
        ["model", "mode", "batch", "in flight", "clients", "request MB", "observed ms",
         "client ms", "wire + server overhead ms", "queue ms", "compute in / infer / out ms",
         "GB/s per stream"], map(_profile_row, _sorted(profiled)), "llrrrrrrrrrr",
        intro=["observed = what the caller waited; client = observed − round trip (encode, "
               "decode, waiting for a window slot); wire + server overhead = round trip − "
               "Triton's queue and compute timers (gRPC transfer and (de)serialisation, request "
               "handling, python-backend copies). coffea's wrapper has no round-trip clock: its "
               "client and wire time are in one column.", ""])


def _scaling_row(name: str, fit: dict) -> list:
    model = fit["model"]
    links = ", ".join(f"{gbps}: {count:.3g}"
                      for gbps, count in fit["network_bound_clients"].items())
    per_client_gbps = fit["bytes_per_event"] * 8 / model["t_ideal"] / 1e9
    return [name, f"{fit['rows_per_event']:g}", format_seconds(model["t_gpu"]),
            format_seconds(model["t_latency"]), format_seconds(model["t_ideal"]),
            f"{model['saturation_clients']:.1f}", f"{model['recommended_cpu_per_gpu']}:1",
            f"{100 * fit['rms_relative_error']:.0f} %",
            "yes" if fit["saturation_observed"] else "no (t_GPU from server stats)",
            f"{per_client_gbps:.2f} Gb/s", links]


def _scaling_section(results: dict) -> list[str]:
    """The scaling model fitted to the clients sweep."""
    scaling = {k: v for k, v in (results.get("scaling") or {}).items() if k != "analysis"}
    lines = section(
        "Scaling model (fitted to the clients sweep)",
        ["model", "rows/event", "t_GPU", "t_latency", "t_ideal", "saturation clients", "CPU:GPU",
         "rms error", "saturation seen", "one client's traffic", "max clients by link (Gb/s)"],
        [_scaling_row(name, fit) for name, fit in scaling.items()], "lrrrrrrrlrl",
        intro=["t_SONIC = (1−p)·t_CPU + t_GPU·[1 + max(0, N_CPU/N_GPU − t_ideal/t_GPU)] + "
               "t_latency, with p = 1 for pure-inference clients; times per event.", ""])
    lines += [f"- {name}: {fit['recommendation']}." for name, fit in scaling.items()]
    analysis = (results.get("scaling") or {}).get("analysis")
    if analysis:
        lines += ["", "### Analysis-level prediction (demo analysis, measured p and t_CPU)", "",
                  analysis["summary"]]
    return lines


def _equality_section(results: dict) -> list[str]:
    """Outputs equal across modes."""
    equality = results.get("equality") or {}
    if not equality.get("max_abs_diff"):
        return []
    rows = [[name, *(cell(per_mode.get(mode), ".1e") for mode in MODES)]
            for name, per_mode in equality["max_abs_diff"].items()]
    rows += [[f"{name}, vs local-gpu", *(cell(per_mode.get(mode), ".1e") for mode in MODES)]
             for name, per_mode in (equality.get("max_abs_diff_vs_local_gpu") or {}).items()]
    return section(
        "Outputs equal across modes", ["model", *MODES], rows, "l" + "r" * len(MODES),
        intro=[f"Reference: {equality['reference']}; tolerance {equality['tolerance']:g} "
               f"({equality.get('gpu_tolerance', 1e-4):g} where the model ran on a GPU); "
               f"all equal: **{'yes' if equality['all_equal'] else 'NO'}**.", ""])


def _e2e_section(results: dict) -> list[str]:
    """The end-to-end demo analysis."""
    e2e = results.get("e2e") or {}
    rows = [[row["inference"], row["workers"], row["events"], f"{row['wall_s']:.2f}",
             format_rate(row["events_per_s"]),
             cell(None if row.get("inference_share") is None
                       else 100 * row["inference_share"], ".0f", " %"),
             cell(row.get("speedup"), ".2f", "×")] for row in e2e.get("rows") or []]
    return section("End to end: demo analysis", ["inference", "workers", "events", "wall s",
                   "events/s", "inference share", "speedup vs CPU"], rows, "lrrrrrr",
                   intro=[e2e.get("summary", ""), ""])


def _save_figure(figure, path: Path, results: dict | None = None) -> bool:
    """Write a benchmark figure (titled with the machine and date of ``results``) and free it."""
    save_figure(figure, path, None if results is None else
                f"{machine_label(results['machine'])}, {results['machine']['date'][:10]}")
    return True


def _panels(records: list[dict]) -> tuple[Any, list[tuple[Any, str]]]:
    """A figure with a panel per model of ``records`` (None without records), with its models."""
    models = sorted({r["model"] for r in records})
    if not models:
        return None, []
    figure, axes = pyplot().subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    return figure, list(zip(axes[0], models))


def _style(axis, legend_size: float | None = None, **settings: Any) -> None:
    """``axis.set(**settings)``, a light grid and the legend."""
    axis.set(**settings)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=legend_size)


def _spread(axis, points: list[dict], x: str, y: str, **style) -> None:
    """``y``'s median against ``x``, its min–max as error bars."""
    median = np.array([r[y]["median"] for r in points])
    low = median - np.array([r[y]["min"] for r in points])
    high = np.array([r[y]["max"] for r in points]) - median
    axis.errorbar([r[x] for r in points], median, yerr=[low, high], marker="o", capsize=3, **style)


def _plot_batch(results: dict, path: Path) -> bool:
    records = _sweep(results, "batch")
    figure, panels = _panels(records)
    for axis, model in panels:
        for mode in MODES:
            mine = [r for r in records if r["model"] == model and r["mode"] == mode]
            for record in (r for r in mine if r["batch_size"] == 0 and r.get("effective_batch")):
                axis.plot([record["effective_batch"]], [record["rows_per_s"]["median"]],
                          marker="*", markersize=14, linestyle="none",
                          color=MODE_COLOURS.get(mode))
            points = [r for r in mine if r["batch_size"] > 0]
            if points:
                _spread(axis, points, "batch_size", "rows_per_s", label=mode,
                        color=MODE_COLOURS.get(mode))
        _style(axis, xscale="log", yscale="log", xlabel="batch size (rows per request)",
               ylabel="rows / s (median, min–max)",
               title=f"{model}: one client process (★ = tool's default batching)")
    return bool(panels) and _save_figure(figure, path, results)


def _plot_clients(results: dict, path: Path) -> bool:
    records = _sweep(results, "clients")
    figure, panels = _panels(records)
    for axis, model in panels:
        for mode in MODES:
            points = sorted((r for r in records if r["model"] == model and r["mode"] == mode),
                            key=lambda r: r["clients"])
            if points:
                _spread(axis, points, "clients", "events_per_s", linestyle="none",
                        label=f"{mode} (measured)", color=MODE_COLOURS.get(mode))
        _plot_fit(axis, (results.get("scaling") or {}).get(model))
        for mode in ("cpu", "local-gpu"):
            single = [r for r in results["measurements"]
                      if r["model"] == model and r["mode"] == mode and r["clients"] == 1]
            if single:
                best = max(r["events_per_s"]["median"] for r in single)
                axis.axhline(best, color=MODE_COLOURS[mode], linestyle="--",
                             label=f"{mode}, one process (best batch)")
        _style(axis, 8, xlabel="concurrent client processes", ylabel="events / s (aggregate)",
               title=f"{model}: measured vs predicted", ylim=(0, None))
    return bool(panels) and _save_figure(figure, path, results)


def _plot_fit(axis, fit: dict | None) -> None:
    """The fitted scaling model's curve and saturation point, where there is a fit."""
    from .scaling import ScalingModel

    if not fit:
        return
    scaling = ScalingModel(**{key: fit["model"][key]
                              for key in ("t_gpu", "t_latency", "p", "t_cpu", "n_gpu")})
    top = max(max(fit["clients"]) * 1.5, scaling.saturation_clients() * 1.3)
    n = np.linspace(1, top, 200)
    axis.plot(n, [scaling.throughput(k) for k in n], color="black",
              label=f"SONIC model (t_GPU {format_seconds(scaling.t_gpu)}/event)")
    axis.axvline(scaling.saturation_clients(), color="black", linestyle=":",
                 label=f"saturation ≈ {scaling.saturation_clients():.1f} clients")


def _plot_in_flight(results: dict, path: Path) -> bool:
    plt = pyplot()
    records = _sweep(results, "in_flight")
    models = sorted({r["model"] for r in records})
    if not models or all(len([r for r in records if r["model"] == m]) < 2 for m in models):
        return False
    figure, axis = plt.subplots(figsize=(6, 4.5))
    for model in models:
        points = sorted((r for r in records if r["model"] == model), key=lambda r: r["in_flight"])
        axis.plot([r["in_flight"] for r in points], [r["rows_per_s"]["median"] for r in points],
                  marker="o", label=f"{model}, batch {points[0]['batch_size']}")
    _style(axis, xlabel="requests in flight", ylabel="rows / s", yscale="log",
           title="remote: pipelining")
    return _save_figure(figure, path)


def _plot_e2e(results: dict, path: Path) -> bool:
    plt = pyplot()
    e2e = results.get("e2e") or {}
    rows = e2e.get("rows") or []
    if not rows:
        return False
    figure, axis = plt.subplots(figsize=(6, 4.5))
    for inference in sorted({row["inference"] for row in rows}):
        points = sorted((row for row in rows if row["inference"] == inference),
                        key=lambda row: row["workers"])
        axis.plot([row["workers"] for row in points], [row["events_per_s"] for row in points],
                  marker="o", label=f"measured: inference {inference}")
    predicted = e2e.get("predicted") or []
    if predicted:
        axis.plot([p["workers"] for p in predicted], [p["events_per_s"] for p in predicted],
                  color="black", linestyle="--", label="SONIC model (served)")
    _style(axis, xlabel="Dask workers", ylabel="events / s", title="demo analysis, end to end",
           ylim=(0, None))
    return _save_figure(figure, path)


def write_outputs(results: dict, output_dir: str | os.PathLike) -> dict[str, Path]:
    """Write results.json, results.md and the PNG plots into ``output_dir``; return their paths."""
    directory = Path(output_dir)
    # the tables come from the unrounded results
    write_report(_clean(results), directory, "results", lambda _: markdown_report(results))
    written = {"json": directory / JSON_NAME, "markdown": directory / MARKDOWN_NAME}
    for key, name, plot in (("batch_plot", BATCH_PLOT, _plot_batch),
                            ("clients_plot", CLIENTS_PLOT, _plot_clients),
                            ("in_flight_plot", IN_FLIGHT_PLOT, _plot_in_flight),
                            ("e2e_plot", E2E_PLOT, _plot_e2e)):
        if plot(results, directory / name):
            written[key] = directory / name
    logger.info("bench outputs in %s: %s", directory, ", ".join(p.name for p in written.values()))
    return written
