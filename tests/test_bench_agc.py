"""``coffea-sonic bench agc``: the AGC's ML step four ways, every answer checked against XGBoost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coffea_sonic.bench.commands import run_scenario

AGC = Path(__file__).parent / "data" / "agc"


@pytest.mark.parametrize("model_files", [None, AGC])
def test_bench_agc_scores_local_served_and_the_agc_client_alike(tmp_path, model_files):
    argv = ["--events", "300", "--seconds", "0.2", "-o", str(tmp_path)]
    if model_files is not None:
        argv += ["--model-files", str(model_files)]
    assert run_scenario("agc", argv) == 0
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
    assert run_scenario("agc", argv) == 0
    report = json.loads((tmp_path / "agc.json").read_text())
    assert [row["case"] for row in report["end_to_end"]] == [
        "AGC analysis, XGBoost in-process", "AGC analysis, served (CPU)"]
    assert all(row["events_per_s"] > 0 for row in report["end_to_end"])
    assert (tmp_path / "agc.png").stat().st_size > 10_000
