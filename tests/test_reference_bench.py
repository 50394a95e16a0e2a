"""The reference bench: NVIDIA's perf_analyzer beside a default TritonModel on a real server."""

from __future__ import annotations

import json

import pytest

from coffea_sonic.bench.perf_analyzer import PerfAnalyzerUnavailable, install
from coffea_sonic.bench.reference import ReferenceConfig, run_reference_bench


def _short(transports: tuple[str, ...]) -> ReferenceConfig:
    return ReferenceConfig(transports=transports, concurrencies=(1,),
                           batches={"passthrough": (16384,)}, call_rows={"passthrough": 50_000},
                           window_s=0.5, pa_window_ms=500)


def test_perf_analyzer_rows_beside_tritonmodel_over_grpc_and_shared_memory(tmp_path):
    try:
        install()
    except PerfAnalyzerUnavailable as why:  # no package index here: the bench says why
        pytest.skip(str(why))
    results = run_reference_bench(_short(("grpc", "shm")), tmp_path)
    rows = {row["transport"]: row for row in results["rows"]}
    for transport in ("grpc", "shm"):
        row = rows[transport]
        assert not row["tm_error"] and not row["pa_error"], row
        assert row["pa_best"]["rows_per_s"] > 0 and row["tm_best"] > 0
        assert row["ratio"] == pytest.approx(row["tm_best"] / row["pa_best"]["rows_per_s"])
        # every perf_analyzer point left TritonModel's shared memory in use (it unregisters all)
        assert row["tm_transport_used"] == transport
    assert json.loads((tmp_path / "results.json").read_text())["rows"][0]["model"] == "passthrough"
    assert "| passthrough | grpc |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "reference.png").stat().st_size > 0


def test_without_perf_analyzer_the_bench_says_why_and_measures_tritonmodel(tmp_path, monkeypatch):
    monkeypatch.setenv("COFFEA_SONIC_PERF_ANALYZER", str(tmp_path / "empty"))
    results = run_reference_bench(_short(("grpc",)), tmp_path)
    assert "COFFEA_SONIC_PERF_ANALYZER" in results["perf_analyzer_error"]
    row = results["rows"][0]
    assert row["tm_best"] > 0 and row["ratio"] is None and row["pa_error"]
    assert "perf_analyzer not run" in (tmp_path / "results.md").read_text()
