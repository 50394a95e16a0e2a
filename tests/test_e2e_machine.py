"""``coffea-sonic bench e2e`` on this machine: a real (small) run of every way it can.

Without a GPU the scenario runs the analysis in-process on CPU and served by a CPU tritonserver,
through real ``processor.Runner`` + Dask workers, and must see the same events, the same
inference rows and the same histograms both ways.
"""

from __future__ import annotations

import json

import pytest

from coffea_sonic.bench.commands.e2e import write_results
from coffea_sonic.bench.e2e import run_end_to_end
from coffea_sonic.server.launcher import gpu_count


@pytest.mark.skipif(gpu_count() > 0, reason="the GPU machines run the full scenario instead")
def test_e2e_scenario_runs_every_way_and_counts_the_same_events(tmp_path):
    result = run_end_to_end(2000, 1, local_gpu=False, chunksize=1000)
    rows = {row["inference"]: row for row in result["rows"]}
    assert set(rows) == {"cpu", "served-cpu"}
    cpu, served = rows["cpu"], rows["served-cpu"]
    assert cpu["events"] == served["events"] > 0
    # every selected jet went through particlenet, every event through deepmet, both ways
    assert cpu["inference_rows"] == served["inference_rows"]
    # and the same histograms, bin by bin, every dataset (particlenet's and deepmet's outputs too)
    assert cpu["histograms"] and cpu["histograms"] == served["histograms"]
    assert cpu["inference_rows"]["deepmet"] == cpu["events"]
    assert cpu["inference_rows"]["particlenet"] == cpu["jets"] > 0
    assert cpu["worker_memory_bytes"] > 0 and cpu["worker_peak_rss_bytes"] > 0
    assert served["speedup"] > 0 and served["server_busy_s"] > 0

    written = write_results(result, str(tmp_path), command="coffea-sonic bench e2e")
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["command"] == "coffea-sonic bench e2e"
    assert "| served-cpu | 0 |" in (tmp_path / "results.md").read_text()
    assert set(written) >= {"json", "markdown"}
