"""benchmarks/agc_bench.py: the AGC's ML step four ways, every answer checked against XGBoost.
The script lives in the repository, not in the package: it is loaded by its path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import REPOSITORY, benchmark_script_help, load_benchmark_script

AGC = Path(__file__).parent / "data" / "agc"

agc_bench = load_benchmark_script("agc_bench")


def test_agc_bench_help_teaches_from_a_checkout():
    shown = benchmark_script_help("agc_bench")
    assert shown.startswith("usage: agc_bench.py ")
    assert "python benchmarks/agc_bench.py --model-files tests/data/agc" in shown


def test_agc_bench_options_and_their_defaults():
    parser = agc_bench.build_parser()
    args = parser.parse_args(["--events", "5000", "--devices", "cpu,gpu"])
    assert (args.events, args.devices, args.seconds) == (5000, ["cpu", "gpu"], 5.0)
    assert Path(args.output) == REPOSITORY / "benchmarks" / "results" / "cpu2-agc"
    assert parser.parse_args(["-o", "elsewhere"]).output == "elsewhere"


def test_agc_chunk_has_the_agcs_permutation_counts():
    rows, even = agc_bench.agc_chunk(10, seed=1)
    assert rows.shape[1] == 20 and rows.dtype.name == "float32" and len(even) == len(rows)
    assert len(rows) >= 12 * 10 and int(even.sum()) <= len(rows)


@pytest.mark.parametrize("model_files", [None, AGC])
def test_bench_agc_scores_local_served_and_the_agc_client_alike(tmp_path, model_files):
    argv = ["--events", "300", "--seconds", "0.2", "-o", str(tmp_path)]
    if model_files is not None:
        argv += ["--model-files", str(model_files)]
    assert agc_bench.main(argv) == 0
    report = json.loads((tmp_path / "agc.json").read_text())
    cases = [case["case"] for case in report["cases"]]
    assert cases[0].startswith("local xgboost") and len(cases) == 3
    assert cases[1:] == ["served (CPU), TritonModel", "AGC client (tritonclient, CPU server)"]
    for case in report["cases"][1:]:
        assert case["max_abs_difference"] <= 1e-5 and case["events_per_s"] > 0
    assert report["rows"] >= 12 * 300
    # version 1 is the model trained on odd events (the AGC's numbering)
    assert Path(report["models"]["1"]).name == ("model_odd.json" if model_files
                                                else "agc_bdt_odd.json")
    assert "| AGC client (tritonclient, CPU server) |" in (tmp_path / "agc.md").read_text()


def test_bench_agc_end_to_end_runs_the_whole_analysis_served_and_in_process(tmp_path):
    argv = ["--events", "200", "--seconds", "0.1", "--end-to-end-events", "400",
            "-o", str(tmp_path)]
    assert agc_bench.main(argv) == 0
    report = json.loads((tmp_path / "agc.json").read_text())
    assert [row["case"] for row in report["end_to_end"]] == [
        "AGC analysis, XGBoost in-process", "AGC analysis, served (CPU)"]
    assert all(row["events_per_s"] > 0 for row in report["end_to_end"])
    assert (tmp_path / "agc.png").stat().st_size > 10_000
