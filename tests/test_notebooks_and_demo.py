"""The user-facing entry points, run as a user would: the demo command and the quickstart notebook."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


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


def test_demo_plot_separates_ttbar_from_light_jets(tmp_path):
    # the same histograms the PNG shows: b-tagged jets per event differ strongly between datasets
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    from coffea_sonic.data.synthetic import write_sample
    from coffea_sonic.examples.jet_tagging import JetTaggingProcessor
    from coffea_sonic.server import LocalTritonServer

    fileset = write_sample(tmp_path, events=1000, files=1)
    schema = type("Quiet", (NanoAODSchema,), {"warn_missing_crossrefs": False})
    with LocalTritonServer(models=["jet_tagger"], device="cpu") as server:
        output = processor.Runner(executor=processor.IterativeExecutor(), schema=schema)(
            {name: {"files": {path: "Events" for path in files}} for name, files in fileset.items()},
            treename="Events",
            processor_instance=JetTaggingProcessor(f"triton+grpc://{server.grpc_address}",
                                                   use_constituents=False))
    n_btag = output["histograms"]["n_btag"]
    mean = {d: np.average(np.arange(8), weights=n_btag[{"dataset": d}].values()) for d in fileset}
    assert mean["ttbar"] > 3 * mean["qcd_light"]


def _run_notebook(name: str, events: int, tmp_path: Path, monkeypatch) -> str:
    """Execute notebooks/``name`` on the embedded server with ``events`` per dataset, in
    ``tmp_path``; return its printed text."""
    monkeypatch.setenv("SONIC_NOTEBOOK_DIR", str(tmp_path))
    monkeypatch.setenv("SONIC_EVENTS", str(events))
    monkeypatch.delenv("SONIC_SERVER", raising=False)
    notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return "".join(str(output.get("text", "")) for cell in notebook.cells
                   for output in cell.get("outputs", []))


def test_quickstart_notebook_runs_against_the_embedded_server(tmp_path, monkeypatch):
    outputs = _run_notebook("01_quickstart.ipynb", 2000, tmp_path, monkeypatch)
    assert "coffea-sonic demo summary" in outputs
    assert (tmp_path / "scores.png").exists()


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


def test_tracking_notebook_runs_against_the_embedded_server(tmp_path, monkeypatch):
    outputs = _run_notebook("04_tracking.ipynb", 100, tmp_path, monkeypatch)
    assert "coffea-sonic tracking demo summary" in outputs
    assert "served vs direct: identical labels" in outputs
    assert (tmp_path / "tracking.png").exists()
