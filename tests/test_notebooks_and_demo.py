"""The user-facing entry points, run as a user would: the demo command and the notebooks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from notebook_runner import run_notebook


def test_demo_command_prints_the_summary_and_writes_a_separating_plot(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "coffea_sonic.cli", "demo", "--events", "4000", "--chunksize", "2000",
         "--output", str(tmp_path), "--device", "cpu", "--no-progress"],
        capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "coffea-sonic demo summary" in completed.stdout
    assert (tmp_path / "scores.png").stat().st_size > 10_000
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["events"] == 8000
    assert summary["client"]["jet_tagger"]["rows"] == summary["jets"] > 0
    assert summary["client"]["jet_tagger"]["fallback_rows"] == 0
    assert summary["server"]["jet_tagger"]["inference_count"] == summary["jets"]


def test_demo_plot_separates_ttbar_from_light_jets(tmp_path, jet_tagger_server):
    # the same histograms the PNG shows: b-tagged jets per event differ strongly between datasets
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    from coffea_sonic.data.synthetic import write_sample
    from coffea_sonic.examples.jet_tagging import JetTaggingProcessor

    fileset = write_sample(tmp_path, events=1000, files=1)
    schema = type("Quiet", (NanoAODSchema,), {"warn_missing_crossrefs": False})
    output = processor.Runner(executor=processor.IterativeExecutor(), schema=schema)(
        {name: {"files": {path: "Events" for path in files}} for name, files in fileset.items()},
        treename="Events",
        processor_instance=JetTaggingProcessor(f"triton+grpc://{jet_tagger_server.grpc_address}",
                                               use_constituents=False))
    n_btag = output["histograms"]["n_btag"]
    mean = {d: np.average(np.arange(8), weights=n_btag[{"dataset": d}].values()) for d in fileset}
    assert mean["ttbar"] > 3 * mean["qcd_light"]


@pytest.fixture
def no_sonic_settings(monkeypatch, tmp_path):
    """A user with no server configured (no COFFEA_SONIC_* variable, no endpoints file)."""
    for name in list(os.environ):
        if name.startswith(("COFFEA_SONIC_", "DASK_COFFEA_SONIC")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))


def test_quickstart_notebook_starts_a_server_when_none_is_configured(tmp_path, no_sonic_settings):
    outputs = run_notebook("01_quickstart.ipynb", tmp_path, EVENTS=2000, WORKDIR=str(tmp_path))
    assert "started the embedded Triton server" in outputs
    assert "4000 events in" in outputs and "rows on a fallback" in outputs
    assert "0 rows on a fallback" in outputs
    assert (tmp_path / "scores.png").stat().st_size > 10_000


def test_quickstart_notebook_uses_the_configured_servers_and_starts_none(
        tmp_path, no_sonic_settings, monkeypatch, triton_server):
    from coffea_sonic import TritonModel

    monkeypatch.setenv("COFFEA_SONIC_SERVERS", triton_server.grpc_address)
    served = TritonModel(triton_server.url("jet_tagger"))
    before = served.server_statistics().inference_count
    outputs = run_notebook("01_quickstart.ipynb", tmp_path, EVENTS=1000, WORKDIR=str(tmp_path))
    assert f"using the configured servers: ['{triton_server.grpc_address}']" in outputs
    assert "started the embedded" not in outputs
    jets = int(re.search(r"jet_tagger: (\d+) jets", outputs).group(1))
    assert jets > 0 and served.server_statistics().inference_count - before == jets


def test_tracking_demo_prints_efficiency_and_purity_and_served_equals_direct(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "coffea_sonic.cli", "demo", "--analysis", "tracking", "--events",
         "100", "--sample-files", "1", "--chunksize", "50", "--workers", "1", "--output",
         str(tmp_path), "--device", "cpu", "--no-progress"],
        capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    printed = dict(line.split(None, 1) for line in completed.stdout.splitlines()
                   if line.startswith(("efficiency ", "purity ")))
    assert float(printed["efficiency"].split()[0]) > 0.9, completed.stdout
    assert float(printed["purity"].split()[0]) > 0.9, completed.stdout
    assert "served vs direct  identical labels on the first 50 events" in completed.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["events"] == 200 and summary["hits"] > 10_000
    assert summary["client"]["trackgnn"]["rows"] == 200  # every event, 0 hits or many
    assert summary["served_vs_direct"]["identical"] is True
    assert (tmp_path / "tracking.png").stat().st_size > 10_000


def test_tracking_notebook_runs_against_the_embedded_server(tmp_path, no_sonic_settings):
    outputs = run_notebook("04_tracking.ipynb", tmp_path, EVENTS=100, WORKDIR=str(tmp_path))
    assert "started the embedded Triton server" in outputs
    assert "coffea-sonic tracking demo summary" in outputs
    assert "served vs direct: identical labels" in outputs
    assert (tmp_path / "tracking.png").exists()


def test_dask_awkward_notebook_builds_without_requests_and_infers_every_jet(
        tmp_path, no_sonic_settings):
    outputs = run_notebook("05_dask_awkward.ipynb", tmp_path, EVENTS=1000, WORKDIR=str(tmp_path))
    assert "started the embedded Triton server" in outputs
    assert "rows inferred while building the graph: 0" in outputs
    jets = int(re.search(r"2000 events, (\d+) jets in", outputs).group(1))
    assert jets > 0 and f"rows the server inferred: {jets}" in outputs
    assert (tmp_path / "scores_dask_awkward.png").stat().st_size > 10_000


def test_agc_notebook_serves_the_bdt_pair_and_equals_xgboost_in_process(tmp_path,
                                                                        no_sonic_settings):
    outputs = run_notebook("06_agc.ipynb", tmp_path, EVENTS=600, WORKDIR=str(tmp_path))
    assert "started the embedded Triton server" in outputs
    assert re.search(r"1200 events in [\d.]+ s; selected: \{'4j1b': \d+, '4j2b': [1-9]\d*\}",
                     outputs), outputs
    repeats = [int(n) for n in re.findall(r"(\d+) calls of the weight-only variations needed no "
                                          r"request", outputs)]
    assert len(repeats) == 2 and all(n > 0 for n in repeats), outputs
    assert "served == local XGBoost: True" in outputs
    assert (tmp_path / "top_mass.png").stat().st_size > 10_000


def test_saved_notebooks_show_no_path_of_the_machine_that_ran_them_and_no_warning():
    """What a user reads before running anything: the outputs stored by scripts/save_notebooks.py
    name no folder of ours (a checkout, a venv, a temporary or home folder) and hold no stderr
    (a warning, a traceback)."""
    import nbformat

    from notebook_runner import NOTEBOOKS

    machine_path = re.compile(r"/tmp/|/work/|/home/|/root/|\.venv/|site-packages")
    found = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
            for output in cell.get("outputs", []):
                text = str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
                if output.get("name") == "stderr" or output.get("output_type") == "error":
                    found.append(f"{path.name} cell {index}: stderr/error {text[:200]!r}")
                found += [f"{path.name} cell {index}: {line.strip()}" for line in text.splitlines()
                          if machine_path.search(line)]
    assert len(list(NOTEBOOKS.glob("*.ipynb"))) == 6
    assert not found, "\n".join(found[:20])
