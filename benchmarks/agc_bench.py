"""The Analysis Grand Challenge's ML step, four ways: events per second of scoring a chunk's jet
permutations with the jet-parton assignment BDT pair (the zoo's ``reconstruction_bdt_xgb``, the
AGC's shape and name, :mod:`coffea_sonic.zoo.trees`; or the AGC's own trained files).

A chunk is ``--events`` events with the AGC's permutation counts (12, 60 or 180 rows of 20
features for 4, 5 or >= 6 jets; ``JET_MULTIPLICITY`` of a ttbar selection); each event is scored
by the model not trained on its parity (even events: version 1, trained on odd events). Cases:

* ``local xgboost``: XGBoost in this process (``Booster.inplace_predict``, one call per parity),
  what the AGC's local path does;
* ``served (CPU)`` / ``served (GPU)``: the embedded server (Triton FIL backend: XGBoost on the
  CPU, or on the GPU with ``device="cuda"``), one default ``TritonModel`` per version, both
  parities in flight together;
* ``AGC client``: the AGC's own client path against the same server: tritonclient gRPC, the
  model's metadata asked per chunk, one synchronous ``infer`` per parity
  (``get_inference_results_triton`` at the pinned commit).

Every answer is checked against local XGBoost (float32 rounding). The AGC's metric, events per
second per core, is the rate over the client's cores (a served case's client is one process on
one core; local XGBoost predicts on every core of the machine). ``--end-to-end-events`` also runs
the whole analysis (``coffea_sonic.examples.agc.AgcProcessor``) served and in-process.

Run from a checkout (it is not part of the installed package): ``python benchmarks/agc_bench.py
--help``; RESULTS.md holds its results.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from coffea_sonic.bench.commands import add_numbers
from coffea_sonic.bench.files import pyplot, save_figure, table, write_report
from coffea_sonic.bench.machine import machine_info, uptime_line
from coffea_sonic.cliargs import add_list_option

MODEL = "reconstruction_bdt_xgb"
#: Share of selected ttbar events with 4, 5 and >= 6 jets (permutations: 12, 60, 180).
JET_MULTIPLICITY = {12: 0.40, 60: 0.32, 180: 0.28}
RESULTS = Path(__file__).resolve().parent / "results" / "cpu2-agc"

DESCRIPTION = """\
Scores a chunk of AGC-like events (12, 60 or 180 jet permutations of 20 features each; each event
by the BDT not trained on its parity) with the zoo's reconstruction_bdt_xgb pair four ways: XGBoost
in this process (the AGC's local path), the embedded server's FIL backend through a default
TritonModel (both parities in flight) on each --devices, and the AGC's own client path
(tritonclient gRPC, metadata per chunk, one synchronous call per parity) against the same server.
Every answer is checked against local XGBoost. Prints events/s, events/s per client core (the AGC's
metric) and the ratio to local XGBoost; writes agc.json, agc.md and agc.png into -o DIR.

examples:
  python benchmarks/agc_bench.py                          # CPU server, 20 000 events per chunk
  python benchmarks/agc_bench.py --model-files tests/data/agc     # the AGC's own 251-tree models
  python benchmarks/agc_bench.py --devices cpu,gpu -o benchmarks/results/gpu-agc   # GPU machine
"""


def build_parser() -> argparse.ArgumentParser:
    """The options; ``-o`` defaults to the folder RESULTS.md names for the CPU machine."""
    parser = argparse.ArgumentParser(prog="agc_bench.py", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", default=str(RESULTS), metavar="DIR",
                        help="folder to write results into (default: benchmarks/results/cpu2-agc "
                             "of this checkout)")
    add_numbers(parser, [("--events", int, 20_000, "events per chunk"),
                         ("--seconds", float, 5.0, "seconds per case"),
                         ("--end-to-end-events", int, 0,
                          "also run the whole AGC analysis (AgcProcessor, one process) on a "
                          "synthetic sample of this many events, served and in-process (0: no)")])
    add_list_option(parser, "--devices", default=["cpu"], choices=["cpu", "gpu"],
                    metavar="DEVICE",
                    help="where the embedded server runs the BDTs (default: cpu; gpu: XGBoost "
                         "on CUDA)")
    parser.add_argument("--model-files", metavar="DIR",
                        help="a folder with the AGC's own model_odd.json (served as version 1) "
                             "and model_even.json (version 2) instead of the zoo's pair")
    return parser


def _files(model_files: str | None) -> dict[int, Path]:
    from coffea_sonic.zoo.trees import tree_file

    if model_files is None:
        return {version: tree_file(MODEL, version) for version in (1, 2)}
    folder = Path(model_files)
    return {1: folder / "model_odd.json", 2: folder / "model_even.json"}


def _server(model_files: str | None, device: str, files: dict[int, Path]) -> Any:
    """The embedded server of the BDT pair: the zoo's by name, or a repository of ``files``."""
    from coffea_sonic.server import LocalTritonServer
    from coffea_sonic.zoo.trees import tree_config_text

    if model_files is None:
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


def _served(server: Any, rows: np.ndarray, even: np.ndarray) -> Callable[[], np.ndarray]:
    from coffea_sonic.model import TritonModel

    models = {version: TritonModel(server.url(MODEL, version)) for version in (1, 2)}

    def score() -> np.ndarray:
        pending = {1: models[1].infer_async({"input__0": rows[even]}),
                   2: models[2].infer_async({"input__0": rows[~even]})}
        out = np.zeros(len(rows), np.float32)
        out[even] = pending[1].result()["output__0"][:, 1]
        out[~even] = pending[2].result()["output__0"][:, 1]
        return out
    return score


def _agc_client(server: Any, rows: np.ndarray, even: np.ndarray) -> Callable[[], np.ndarray]:
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


def run_agc(args: argparse.Namespace) -> dict:
    """Every case; the report (machine, load, command, rates, ratios to local XGBoost)."""
    rows, even = agc_chunk(args.events)
    files = _files(args.model_files)
    report = {"machine": machine_info(), "uptime_before": uptime_line(),
              "command": " ".join(sys.argv), "events": args.events, "rows": len(rows),
              "seconds": args.seconds, "models": {v: str(p) for v, p in files.items()},
              "cases": []}
    local_rate, reference = _rate(_local(rows, even, files), args.events, args.seconds)
    cores = os.cpu_count() or 1
    report["cases"].append({"case": f"local xgboost (this process, {cores} CPU threads)",
                            "events_per_s": local_rate, "client_cores": cores})
    for device in args.devices:
        with _server(args.model_files, device, files) as server:
            cases = ((f"served ({device.upper()}), TritonModel", _served),
                     (f"AGC client (tritonclient, {device.upper()} server)", _agc_client))
            for name, make in cases:
                rate, answer = _rate(make(server, rows, even), args.events, args.seconds)
                worst = float(np.abs(answer - reference).max())
                if worst > 1e-5:
                    raise AssertionError(f"{name}: answers differ from local XGBoost by {worst}")
                report["cases"].append({"case": name, "events_per_s": rate, "client_cores": 1,
                                        "max_abs_difference": worst})
    for case in report["cases"]:
        case["vs_local"] = case["events_per_s"] / local_rate
        case["events_per_s_per_core"] = case["events_per_s"] / case["client_cores"]
    if args.end_to_end_events:
        report["end_to_end"] = _end_to_end(args, files)
    report["uptime_after"] = uptime_line()
    report["client_cores_available"] = os.cpu_count()
    return report


def _end_to_end(args: argparse.Namespace, files: dict[int, Path]) -> list[dict]:
    """The whole AGC analysis (selection, features, the ML step, histograms, systematics) in one
    process on a synthetic sample: events/s served on each device and with XGBoost in-process;
    the ML histograms of every case equal the local ones."""
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    from coffea_sonic.data.agc_sample import write_agc_sample
    from coffea_sonic.examples.agc import AgcProcessor

    schema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
    sample = write_agc_sample(tempfile.mkdtemp(prefix="agc-e2e-"),
                              events=args.end_to_end_events // 2, files=2, seed=5)
    runnable = {name: {"files": {path: "Events" for path in paths}}
                for name, paths in sample.items()}

    def run(instance: Any) -> tuple[float, dict]:
        runner = processor.Runner(executor=processor.IterativeExecutor(status=False),
                                  schema=schema, chunksize=20_000)
        began = time.perf_counter()
        output = runner(runnable, treename="Events", processor_instance=instance)
        return args.end_to_end_events / (time.perf_counter() - began), output

    rate, local = run(AgcProcessor(local_models={v: str(p) for v, p in files.items()}))
    rows = [{"case": "AGC analysis, XGBoost in-process", "events_per_s": rate}]
    for device in args.devices:
        with _server(args.model_files, device, files) as server:
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
    gpus = ", ".join(m.get("gpus") or []) or "no GPU"
    lines = [f"# AGC ML step: {report['events']} events ({report['rows']} permutations) per chunk "
             f"({m['cpu_model']}, {m['cpu_cores']} cores, {gpus}, {m['date']})", "",
             f"load: before `{report['uptime_before']}`, after "
             f"`{report.get('uptime_after', '')}`", "", f"command: `{report['command']}`", "",
             *table(["case", "events/s", "events/s per client core", "vs local xgboost"], [
                 [row["case"], f"{row['events_per_s']:,.0f}",
                  f"{row['events_per_s_per_core']:,.0f}",
                  f"{row['vs_local']:.2f}x" if "vs_local" in row else "-"]
                 for row in [*report["cases"], *report.get("end_to_end", [])]])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run every case; write agc.json, agc.md and agc.png into ``-o``; print the table."""
    args = build_parser().parse_args(argv)
    report = run_agc(args)
    print(write_report(report, args.output, "agc", markdown))
    plot_agc([report], Path(args.output) / "agc.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
