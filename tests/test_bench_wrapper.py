"""``coffea-sonic bench wrapper``: coffea's ``triton_wrapper`` against TritonModel on every
transport, run tiny for real (an embedded CPU server, the slice16 python-backend model)."""

from __future__ import annotations

import json

import pytest

from coffea_sonic.bench.commands import run_scenario

ROWS, BATCH = 10_000, 4096


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("wrapper")
    code = run_scenario("wrapper", ["--max-batch-size", str(BATCH), "--rows", str(ROWS),
                                    "--rounds", "2", "--sweep-rounds", "1", "--sweep-mib", "1",
                                    "--sweep-in-flight", "2", "-o", str(out)])
    assert code == 0
    return out, json.loads((out / "results.json").read_text())


def test_every_client_answers_and_is_compared_with_the_wrapper_in_one_run(tiny_run):
    out, results = tiny_run
    (run,) = results["runs"]
    rows = {row["client"]: row for row in run["comparison"]}
    assert set(rows) == {"coffea-wrapper", "grpc", "shm", "auto (default)", "http"}
    assert not [name for name, row in rows.items() if "error" in row]
    assert [rows[name]["sent"]["transport_kind"] for name in ("grpc", "shm", "http")] == [
        "grpc", "shm", "http"]
    for name, row in rows.items():
        assert len(run["timings_s"][name]) == row["calls"] == 2
        assert ("ratio_to_wrapper" in row) == (name != "coffea-wrapper")
        # Triton's counters are read around each call; they may count a call's last request
        # only after the call returned
        assert 0 < row["server"]["requests_per_call"] <= row["sent"]["requests_per_call"] + 1
    assert {"results.json", "results.md", "wrapper_vs_tritonmodel.png"} <= {
        path.name for path in out.iterdir()}


def test_the_wrapper_pads_every_request_to_the_servers_batch_and_tritonmodel_sends_the_rows(
        tiny_run):
    _, results = tiny_run
    rows = {row["client"]: row for row in results["runs"][0]["comparison"]}
    requests = -(-ROWS // BATCH)
    assert rows["coffea-wrapper"]["sent"] == {
        "requests_per_call": requests, "rows_per_request": BATCH,
        "bytes_sent_per_call": requests * BATCH * 16 * 4, "in_flight": 1}
    assert rows["grpc"]["sent"]["bytes_sent_per_call"] == ROWS * 16 * 4


def test_serial_breakdown_and_sweep_cover_each_transport(tiny_run):
    _, results = tiny_run
    (run,) = results["runs"]
    serial = run["serial_breakdown"]
    assert [serial[t]["transport_kind"] for t in ("grpc", "shm")] == ["grpc", "shm"]
    assert all(serial[t]["in_flight"] == 1 for t in serial)
    assert sorted((r["transport"], r["max_request_mib"], r["max_in_flight"])
                  for r in run["sweep"]) == [("grpc", 1.0, 2), ("http", 1.0, 2), ("shm", 1.0, 2)]
    assert results["client_steps"]["piece_rows"] == ROWS  # a 4 MiB piece is more than a call
