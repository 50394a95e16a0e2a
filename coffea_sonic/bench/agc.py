"""The Analysis Grand Challenge's ML step, four ways: events per second of scoring a chunk's jet
permutations with the jet-parton assignment BDT pair (the zoo's ``reconstruction_bdt_xgb``,
the AGC's shape and name, :mod:`coffea_sonic.zoo.trees`; or the AGC's own trained files).
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .files import pyplot, save_figure, table, write_report
from .machine import machine_info, uptime_line

__all__ = ["AgcBench", "JET_MULTIPLICITY", "agc_chunk", "markdown", "plot_agc", "run_agc",
           "write_agc"]

MODEL = "reconstruction_bdt_xgb"
#: Share of selected ttbar events with 4, 5 and >= 6 jets (permutations: 12, 60, 180).
JET_MULTIPLICITY = {12: 0.40, 60: 0.32, 180: 0.28}


@dataclass
class AgcBench:
    """Events per chunk, seconds per case, and where the server runs."""

    events: int = 20_000
    seconds: float = 5.0
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    #: a folder with the AGC's own ``model_odd.json`` (version 1) and ``model_even.json``
    #: (version 2) to use instead of the zoo's pair (None: the zoo's)
    model_files: str | None = None
    #: events of the synthetic AGC-like sample the whole analysis runs on (0: none), one
    #: process (coffea's IterativeExecutor), served and with XGBoost in-process
    end_to_end_events: int = 0


def _files(config: AgcBench) -> dict[int, Path]:
    from ..zoo.trees import tree_file

    if config.model_files is None:
        return {version: tree_file(MODEL, version) for version in (1, 2)}
    folder = Path(config.model_files)
    return {1: folder / "model_odd.json", 2: folder / "model_even.json"}


def _server(config: AgcBench, device: str, files: dict[int, Path]):
    """The embedded server of the BDT pair: the zoo's by name, or a repository of ``files``."""
    from ..server import LocalTritonServer
    from ..zoo.trees import tree_config_text

    if config.model_files is None:
        return LocalTritonServer(models=[MODEL], device=device)
    repository = Path(tempfile.mkdtemp(prefix="agc-bench-"))
    (repository / MODEL).mkdir()
    (repository / MODEL / "config.pbtxt").write_text(tree_config_text(MODEL, device))
    for version, path in files.items():
        (repository / MODEL / str(version)).mkdir()
        shutil.copyfile(path, repository / MODEL / str(version) / "xgboost.json")
    return LocalTritonServer(repository=repository, device=device)


def agc_chunk(events: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(permutation rows ``[n, 20]`` float32, per-row even-event flag) of ``events`` events."""
    rng = np.random.default_rng(seed)
    counts = rng.choice(list(JET_MULTIPLICITY), size=events, p=list(JET_MULTIPLICITY.values()))
    even = (np.arange(events) % 2 == 0)
    rows = rng.normal(size=(int(counts.sum()), 20)).astype(np.float32)
    return rows, np.repeat(even, counts)


def _rate(score: Callable[[], np.ndarray], events: int, seconds: float) -> tuple[float, np.ndarray]:
    """Events per second of calling ``score`` for ``seconds`` (after one warm-up call)."""
    answer = score()
    calls, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds or calls == 0:
        score()
        calls += 1
    return calls * events / (time.perf_counter() - began), answer


def _local(rows: np.ndarray, even: np.ndarray,
           files: dict[int, Path]) -> Callable[[], np.ndarray]:
    import xgboost

    boosters = {version: xgboost.Booster(model_file=str(path)) for version, path in files.items()}

    def score() -> np.ndarray:
        out = np.zeros(len(rows), np.float32)
        out[even] = boosters[1].inplace_predict(rows[even])  # trained on odd events
        out[~even] = boosters[2].inplace_predict(rows[~even])
        return out
    return score


def _served(server, rows: np.ndarray, even: np.ndarray) -> Callable[[], np.ndarray]:
    from ..model import TritonModel

    models = {version: TritonModel(server.url(MODEL, version)) for version in (1, 2)}

    def score() -> np.ndarray:
        pending = {1: models[1].infer_async({"input__0": rows[even]}),
                   2: models[2].infer_async({"input__0": rows[~even]})}
        out = np.zeros(len(rows), np.float32)
        out[even] = pending[1].result()["output__0"][:, 1]
        out[~even] = pending[2].result()["output__0"][:, 1]
        return out
    return score


def _agc_client(server, rows: np.ndarray, even: np.ndarray) -> Callable[[], np.ndarray]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_address)

    def score() -> np.ndarray:  # get_inference_results_triton, AGC commit c37bf59
        metadata = client.get_model_metadata(MODEL, "1")
        input_name, dtype = metadata.inputs[0].name, metadata.inputs[0].datatype
        output_name = metadata.outputs[0].name
        output = grpcclient.InferRequestedOutput(output_name)
        out = np.zeros(len(rows), np.float32)
        for mask, version in ((even, "1"), (~even, "2")):
            inputs = [grpcclient.InferInput(input_name, rows[mask].shape, dtype)]
            inputs[0].set_data_from_numpy(rows[mask].astype(np.float32))
            out[mask] = client.infer(model_name=MODEL, model_version=version, inputs=inputs,
                                     outputs=[output]).as_numpy(output_name)[:, 1]
        return out
    return score


def run_agc(config: AgcBench) -> dict:
    """Every case; the report (machine, load, command, rates, ratios to local XGBoost)."""
    import sys

    rows, even = agc_chunk(config.events)
    files = _files(config)
    report = {"machine": machine_info(), "uptime_before": uptime_line(),
              "command": " ".join(sys.argv), "events": config.events, "rows": len(rows),
              "seconds": config.seconds, "models": {v: str(p) for v, p in files.items()},
              "cases": []}
    local_rate, reference = _rate(_local(rows, even, files), config.events, config.seconds)
    cores = os.cpu_count() or 1
    report["cases"].append({"case": f"local xgboost (this process, {cores} CPU threads)",
                            "events_per_s": local_rate, "client_cores": cores})
    for device in config.devices:
        with _server(config, device, files) as server:
            for name, make in ((f"served ({device.upper()}), TritonModel", _served),
                               (f"AGC client (tritonclient, {device.upper()} server)", _agc_client)):
                rate, answer = _rate(make(server, rows, even), config.events, config.seconds)
                worst = float(np.abs(answer - reference).max())
                if worst > 1e-5:
                    raise AssertionError(f"{name}: answers differ from local XGBoost by {worst}")
                report["cases"].append({"case": name, "events_per_s": rate, "client_cores": 1,
                                        "max_abs_difference": worst})
    for case in report["cases"]:
        case["vs_local"] = case["events_per_s"] / local_rate
        case["events_per_s_per_core"] = case["events_per_s"] / case["client_cores"]
    if config.end_to_end_events:
        report["end_to_end"] = _end_to_end(config, files)
    report["uptime_after"] = uptime_line()
    report["client_cores_available"] = os.cpu_count()
    return report


def _end_to_end(config: AgcBench, files: dict[int, Path]) -> list[dict]:
    """The whole AGC analysis (selection, features, the ML step, histograms, systematics) in one
    process on a synthetic sample: events/s served on each device and with XGBoost in-process;
    the ML histograms of every case equal the local ones."""
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    from ..data.agc_sample import write_agc_sample
    from ..examples.agc import AgcProcessor

    schema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
    sample = write_agc_sample(tempfile.mkdtemp(prefix="agc-e2e-"),
                              events=config.end_to_end_events // 2, files=2, seed=5)
    runnable = {name: {"files": {path: "Events" for path in paths}}
                for name, paths in sample.items()}

    def run(instance) -> tuple[float, dict]:
        runner = processor.Runner(executor=processor.IterativeExecutor(status=False),
                                  schema=schema, chunksize=20_000)
        began = time.perf_counter()
        output = runner(runnable, treename="Events", processor_instance=instance)
        return config.end_to_end_events / (time.perf_counter() - began), output

    rate, local = run(AgcProcessor(local_models={v: str(p) for v, p in files.items()}))
    rows = [{"case": "AGC analysis, XGBoost in-process", "events_per_s": rate}]
    for device in config.devices:
        with _server(config, device, files) as server:
            rate, served = run(AgcProcessor(f"triton+grpc://{server.grpc_address}"))
        top = "mass_w1w2btophad"
        if not np.array_equal(served["ml_hist_dict"][top].values(),
                              local["ml_hist_dict"][top].values()):
            raise AssertionError(f"served on {device}: the top-mass histogram differs from local")
        rows.append({"case": f"AGC analysis, served ({device.upper()})", "events_per_s": rate})
    for row in rows:
        row["events_per_s_per_core"] = row["events_per_s"]  # one process
    return rows


def plot_agc(reports: list[dict], path: str | Path) -> Path:
    """Events/s of each case, one panel per report (machine)."""
    plt = pyplot()
    figure, axes = plt.subplots(1, len(reports), figsize=(6 * len(reports), 3.2), squeeze=False)
    for axis, report in zip(axes[0], reports):
        cases = report["cases"] + report.get("end_to_end", [])
        names = [case["case"] for case in cases][::-1]
        axis.barh(names, [case["events_per_s"] for case in cases][::-1], color="tab:blue")
        m = report["machine"]
        axis.set_title(f"{', '.join(m.get('gpus') or []) or 'no GPU'}, {m['cpu_cores']} cores "
                       f"({m['date'][:10]})", fontsize=8)
        axis.set_xlabel("events/s")
        axis.tick_params(labelsize=7)
    return save_figure(figure, path, "AGC ML step: local XGBoost, served, the AGC's client")


def markdown(report: dict) -> str:
    """The cases as a table, with machine, load and command."""
    m = report["machine"]
    lines = [f"# AGC ML step: {report['events']} events ({report['rows']} permutations) per chunk "
             f"({m['cpu_model']}, {m['cpu_cores']} cores, {', '.join(m.get('gpus') or []) or 'no GPU'}, "
             f"{m['date']})", "", f"load: before `{report['uptime_before']}`, after "
             f"`{report.get('uptime_after', '')}`", "", f"command: `{report['command']}`", "",
             *table(["case", "events/s", "events/s per client core", "vs local xgboost"], [
                 [row["case"], f"{row['events_per_s']:,.0f}", f"{row['events_per_s_per_core']:,.0f}",
                  f"{row['vs_local']:.2f}x" if "vs_local" in row else "-"]
                 for row in [*report["cases"], *report.get("end_to_end", [])]])]
    return "\n".join(lines) + "\n"


def write_agc(report: dict, out: str) -> str:
    """agc.json, agc.md and agc.png in ``out``; returns the table."""
    table = write_report(report, out, "agc", markdown)
    plot_agc([report], Path(out) / "agc.png")
    return table
