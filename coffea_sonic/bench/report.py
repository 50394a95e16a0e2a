"""Write a benchmark result as JSON, a markdown report and PNG plots.

>>> format_rate(1_234_567.0), format_rate(512.0), format_bytes(3 * 2**20)
('1.23 M', '512', '3.0 MiB')
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import numpy as np

from .config import MODES
from .files import pyplot, save_figure
from .machine import machine_label

logger = logging.getLogger(__name__)

#: Files :func:`write_outputs` writes (plots only where there is something to draw).
JSON_NAME, MARKDOWN_NAME = "results.json", "results.md"
BATCH_PLOT, CLIENTS_PLOT, IN_FLIGHT_PLOT, E2E_PLOT = (
    "throughput_vs_batch.png", "throughput_vs_clients.png", "throughput_vs_in_flight.png",
    "e2e_speedup.png")
MODE_COLOURS = {"cpu": "tab:blue", "local-gpu": "tab:green", "remote": "tab:red",
                "remote-sync": "tab:orange", "coffea-wrapper": "tab:gray"}


def format_rate(value: float | None) -> str:
    """Human-readable count per second (k, M, G)."""
    if value is None or not math.isfinite(value):
        return "–"
    for scale, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def format_bytes(value: float | None) -> str:
    if value is None:
        return "–"
    for scale, suffix in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {suffix}"
    return f"{value:.0f} B"


def format_seconds(value: float | None) -> str:
    """Seconds with a unit that keeps three significant digits.

    >>> format_seconds(0.0123), format_seconds(2.5e-6), format_seconds(3.0)
    ('12.3 ms', '2.5 µs', '3 s')
    """
    if value is None or not math.isfinite(value):
        return "–"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


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
    return f"{_ms(record['latency'].get('p50_ms'))} / {_ms(record['latency'].get('p99_ms'))}"


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
    """Throughput by mode and batch size (one client process)."""
    lines: list[str] = []
    lines += ["", "## Throughput by mode and batch size (one client process)", "",
              "| model | mode | batch | in flight | rows/s | spread | events/s | latency p50 / p99 ms "
              "| server queue / compute ms per request (avg batch) | client RSS growth / tensor bytes, median chunk "
              "| max abs diff |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in _sweep(results, "batch"):
        diff = r.get("max_abs_diff")
        lines.append(
            f"| {r['model']} | {r['mode']} | {batch_cell(r)} | {r['in_flight']} | "
            f"{_rate_cells(r)} | {format_rate(r['events_per_s']['median'])} | "
            f"{_latency_cell(r)} | {_server_cell(r)} | {_rss_cell(r)} | "
            f"{'–' if diff is None else f'{diff:.1e}'} |")
    return lines


def _in_flight_section(results: dict) -> list[str]:
    """Requests in flight (remote, one client)."""
    lines: list[str] = []
    in_flight = _sweep(results, "in_flight")
    if in_flight:
        lines += ["", "## Requests in flight (remote, one client)", "",
                  "| model | batch | in flight | rows/s | spread | latency p50 / p99 ms | "
                  "server queue / compute ms (avg batch) |", "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['model']} | {batch_cell(r)} | {r['in_flight']} | {_rate_cells(r)} | "
                  f"{_latency_cell(r)} | {_server_cell(r)} |" for r in in_flight]
    return lines


def _clients_section(results: dict) -> list[str]:
    """Concurrent client processes."""
    lines: list[str] = []
    clients = _sweep(results, "clients")
    if clients:
        lines += ["", "## Concurrent client processes", "",
                  "| model | mode | batch | clients | aggregate rows/s | spread | events/s | "
                  "server busy | GPU util mean / max % | client RSS growth / tensor bytes, median chunk of the worst process |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in clients:
            busy = (r.get("server") or {}).get("busy_fraction")
            gpu = r.get("gpu") or {}
            gpu_cell = ("–" if gpu.get("mean_percent") is None
                        else f"{gpu['mean_percent']:.0f} / {gpu['max_percent']:.0f}")
            lines.append(
                f"| {r['model']} | {r['mode']} | {batch_cell(r)} | {r['clients']} | "
                f"{_rate_cells(r)} | {format_rate(r['events_per_s']['median'])} | "
                f"{'–' if busy is None else f'{100 * busy:.0f} %'} | {gpu_cell} | "
                f"{_rss_cell(r)} |")
    return lines


def _targets_section(results: dict) -> list[str]:
    """The targets and whether they were met."""
    lines: list[str] = []
    targets = results.get("targets") or []
    if targets:
        lines += ["", "## Targets", "", "| target | model | measured | goal | met | how |",
                  "|---|---|---:|---:|---|---|"]
        for t in targets:
            goal = "–" if t["target"] is None else (("≤ " if t.get("lower_is_better") else "≥ ")
                                                    + f"{t['target']:g}")
            met = {True: "yes", False: "**no**", None: "–"}[t["met"]]
            measured = "–" if t["measured"] is None else f"{t['measured']:.2f}"
            note = t["detail"] + (f"; {t['shortfall']}" if t.get("shortfall") else "")
            lines.append(f"| {t['name']} | {t['model']} | {measured} | {goal} | {met} | {note} |")
    return lines


def _profile_section(results: dict) -> list[str]:
    """Where the time goes, per request (served modes)."""
    lines: list[str] = []
    profiled = [r for r in results["measurements"] if r.get("profile")
                and ("in_flight" in r.get("sweeps", ()) or "clients" in r.get("sweeps", ())
                     or r["batch_size"] == 0 or r["mode"] != "remote")]
    if profiled:
        lines += ["", "## Where the time goes (served modes, per request, means)", "",
                  "observed = what the caller waited; client = observed − round trip (encode, "
                  "decode, waiting for a window slot); wire + server overhead = round trip − "
                  "Triton's queue and compute timers (gRPC transfer and (de)serialisation, request "
                  "handling, python-backend copies). coffea's wrapper has no round-trip clock: its "
                  "client and wire time are in one column.", "",
                  "| model | mode | batch | in flight | clients | request MB | observed ms | client ms "
                  "| wire + server overhead ms | queue ms | compute in / infer / out ms | GB/s per stream |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in _sorted(profiled):
            p = r["profile"]
            lines.append(
                f"| {r['model']} | {r['mode']} | {batch_cell(r)} | {r['in_flight']} | "
                f"{r['clients']} | {p['request_mb']:.2f} | {_ms(p['observed_ms'])} | "
                f"{_ms(p['client_ms'])} | {_ms(p['wire_and_server_overhead_ms'])} | "
                f"{_ms(p['queue_ms'])} | {p['compute_input_ms']:.2f} / {p['compute_infer_ms']:.2f} "
                f"/ {p['compute_output_ms']:.2f} | "
                f"{_ms(p['observed_gb_per_s'])} |")
    return lines


def _scaling_section(results: dict) -> list[str]:
    """The scaling model fitted to the clients sweep."""
    lines: list[str] = []
    scaling = {k: v for k, v in (results.get("scaling") or {}).items() if k != "analysis"}
    if scaling:
        lines += ["", "## Scaling model (fitted to the clients sweep)", "",
                  "t_SONIC = (1−p)·t_CPU + t_GPU·[1 + max(0, N_CPU/N_GPU − t_ideal/t_GPU)] + "
                  "t_latency, with p = 1 for pure-inference clients; times per event.", "",
                  "| model | rows/event | t_GPU | t_latency | t_ideal | saturation clients "
                  "| CPU:GPU | rms error | saturation seen | one client's traffic | max clients by link (Gb/s) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]
        for name, fit in scaling.items():
            model = fit["model"]
            links = ", ".join(f"{gbps}: {count:.3g}"
                              for gbps, count in fit["network_bound_clients"].items())
            per_client_gbps = fit["bytes_per_event"] * 8 / model["t_ideal"] / 1e9
            lines.append(
                f"| {name} | {fit['rows_per_event']:g} | {format_seconds(model['t_gpu'])} | "
                f"{format_seconds(model['t_latency'])} | {format_seconds(model['t_ideal'])} | "
                f"{model['saturation_clients']:.1f} | {model['recommended_cpu_per_gpu']}:1 | "
                f"{100 * fit['rms_relative_error']:.0f} % | "
                f"{'yes' if fit['saturation_observed'] else 'no (t_GPU from server stats)'} | "
                f"{per_client_gbps:.2f} Gb/s | {links} |")
        for name, fit in scaling.items():
            lines.append(f"- {name}: {fit['recommendation']}.")
    analysis = (results.get("scaling") or {}).get("analysis")
    if analysis:
        lines += ["", "### Analysis-level prediction (demo analysis, measured p and t_CPU)", "",
                  analysis["summary"]]
    return lines


def _equality_section(results: dict) -> list[str]:
    """Outputs equal across modes."""
    lines: list[str] = []
    equality = results.get("equality") or {}
    if equality.get("max_abs_diff"):
        lines += ["", "## Outputs equal across modes", "",
                  f"Reference: {equality['reference']}; tolerance {equality['tolerance']:g} "
                  f"({equality.get('gpu_tolerance', 1e-4):g} where the model ran on a GPU); "
                  f"all equal: **{'yes' if equality['all_equal'] else 'NO'}**.", "",
                  "| model | " + " | ".join(MODES) + " |", "|---|" + "---:|" * len(MODES)]
        for name, per_mode in equality["max_abs_diff"].items():
            cells = [("–" if per_mode.get(mode) is None else f"{per_mode[mode]:.1e}")
                     for mode in MODES]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        for name, per_mode in (equality.get("max_abs_diff_vs_local_gpu") or {}).items():
            cells = [("–" if per_mode.get(mode) is None else f"{per_mode[mode]:.1e}")
                     for mode in MODES]
            lines.append(f"| {name}, vs local-gpu | " + " | ".join(cells) + " |")
    return lines


def _e2e_section(results: dict) -> list[str]:
    """The end-to-end demo analysis."""
    lines: list[str] = []
    e2e = results.get("e2e")
    if e2e:
        lines += ["", "## End to end: demo analysis", "", e2e.get("summary", "")]
        if e2e.get("rows"):
            lines += ["", "| inference | workers | events | wall s | events/s | inference share | "
                      "speedup vs CPU |", "|---|---:|---:|---:|---:|---:|---:|"]
            for row in e2e["rows"]:
                share = row.get("inference_share")
                speedup = row.get("speedup")
                lines.append(
                    f"| {row['inference']} | {row['workers']} | {row['events']} | "
                    f"{row['wall_s']:.2f} | {format_rate(row['events_per_s'])} | "
                    f"{'–' if share is None else f'{100 * share:.0f} %'} | "
                    f"{'–' if speedup is None else f'{speedup:.2f}×'} |")
    return lines


def _save_figure(figure, path: Path, results: dict | None = None) -> bool:
    """Write a benchmark figure (titled with the machine and date of ``results``) and free it."""
    save_figure(figure, path, None if results is None else
                f"{machine_label(results['machine'])}, {results['machine']['date'][:10]}")
    return True


def _plot_batch(results: dict, path: Path) -> bool:
    plt = pyplot()
    records = _sweep(results, "batch")
    models = sorted({r["model"] for r in records})
    if not models:
        return False
    figure, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for axis, model in zip(axes[0], models):
        for mode in MODES:
            points = [r for r in records if r["model"] == model and r["mode"] == mode
                      and r["batch_size"] > 0]
            defaults = [r for r in records if r["model"] == model and r["mode"] == mode
                        and r["batch_size"] == 0 and r.get("effective_batch")]
            for record in defaults:
                axis.plot([record["effective_batch"]], [record["rows_per_s"]["median"]],
                          marker="*", markersize=14, linestyle="none",
                          color=MODE_COLOURS.get(mode))
            if not points:
                continue
            x = [r["batch_size"] for r in points]
            y = np.array([r["rows_per_s"]["median"] for r in points])
            low = y - np.array([r["rows_per_s"]["min"] for r in points])
            high = np.array([r["rows_per_s"]["max"] for r in points]) - y
            axis.errorbar(x, y, yerr=[low, high], marker="o", capsize=3, label=mode,
                          color=MODE_COLOURS.get(mode))
        axis.set(xscale="log", yscale="log", xlabel="batch size (rows per request)",
                 ylabel="rows / s (median, min–max)",
                 title=f"{model}: one client process (★ = tool's default batching)")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    return _save_figure(figure, path, results)


def _plot_clients(results: dict, path: Path) -> bool:
    plt = pyplot()
    from .scaling import ScalingModel

    records = _sweep(results, "clients")
    models = sorted({r["model"] for r in records})
    if not models:
        return False
    figure, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for axis, model in zip(axes[0], models):
        for mode in MODES:
            points = sorted((r for r in records if r["model"] == model and r["mode"] == mode),
                            key=lambda r: r["clients"])
            if not points:
                continue
            x = [r["clients"] for r in points]
            y = np.array([r["events_per_s"]["median"] for r in points])
            low = y - np.array([r["events_per_s"]["min"] for r in points])
            high = np.array([r["events_per_s"]["max"] for r in points]) - y
            axis.errorbar(x, y, yerr=[low, high], marker="o", capsize=3, linestyle="none",
                          label=f"{mode} (measured)", color=MODE_COLOURS.get(mode))
        fit = (results.get("scaling") or {}).get(model)
        if fit:
            params = {key: fit["model"][key] for key in
                      ("t_gpu", "t_latency", "p", "t_cpu", "n_gpu")}
            scaling = ScalingModel(**params)
            top = max(max(fit["clients"]) * 1.5, scaling.saturation_clients() * 1.3)
            n = np.linspace(1, top, 200)
            axis.plot(n, [scaling.throughput(k) for k in n], color="black",
                      label=f"SONIC model (t_GPU {format_seconds(scaling.t_gpu)}/event)")
            axis.axvline(scaling.saturation_clients(), color="black", linestyle=":",
                         label=f"saturation ≈ {scaling.saturation_clients():.1f} clients")
        for mode in ("cpu", "local-gpu"):
            single = [r for r in results["measurements"]
                      if r["model"] == model and r["mode"] == mode and r["clients"] == 1]
            if single:
                best = max(r["events_per_s"]["median"] for r in single)
                axis.axhline(best, color=MODE_COLOURS[mode], linestyle="--",
                             label=f"{mode}, one process (best batch)")
        axis.set(xlabel="concurrent client processes", ylabel="events / s (aggregate)",
                 title=f"{model}: measured vs predicted")
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    return _save_figure(figure, path, results)


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
    axis.set(xlabel="requests in flight", ylabel="rows / s", yscale="log",
             title="remote: pipelining")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
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
    axis.set(xlabel="Dask workers", ylabel="events / s", title="demo analysis, end to end")
    axis.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    axis.legend()
    return _save_figure(figure, path)


def write_outputs(results: dict, output_dir: str | os.PathLike) -> dict[str, Path]:
    """Write results.json, results.md and the PNG plots into ``output_dir``; return their paths."""
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    json_path = directory / JSON_NAME
    with open(json_path, "w") as handle:
        json.dump(_clean(results), handle, indent=1, allow_nan=False)
    written["json"] = json_path
    markdown_path = directory / MARKDOWN_NAME
    markdown_path.write_text(markdown_report(results))
    written["markdown"] = markdown_path
    for key, name, plot in (("batch_plot", BATCH_PLOT, _plot_batch),
                            ("clients_plot", CLIENTS_PLOT, _plot_clients),
                            ("in_flight_plot", IN_FLIGHT_PLOT, _plot_in_flight),
                            ("e2e_plot", E2E_PLOT, _plot_e2e)):
        if plot(results, directory / name):
            written[key] = directory / name
    logger.info("bench outputs in %s: %s", directory, ", ".join(p.name for p in written.values()))
    return written
