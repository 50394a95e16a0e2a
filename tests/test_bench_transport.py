"""``coffea-sonic bench transport``: a short real run (embedded tritonserver, spawned client
processes over gRPC and shared memory), its JSON, table and figure, and the figure redrawn."""

from __future__ import annotations

import json

from coffea_sonic import cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_transport_bench_writes_a_row_per_transport_with_server_statistics_and_a_figure(tmp_path):
    code = cli.main(["bench", "transport", "--plan", "quick", "--transports", "grpc,shm",
                     "--duration-s", "1", "--device", "cpu", "-o", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "results-quick.json").read_text())
    records = report["records"]
    assert {record["kind"] for record in records} == {"grpc", "shm"}
    assert {(r["kind"], r["model"]) for r in records} == {
        ("grpc", "payload_sink"), ("shm", "payload_sink"), ("shm", "jet_tagger")}
    for record in records:
        assert record["errors"] == []
        assert record["requests"] > 0 and record["rows_per_s"] > 0 and record["gb_per_s"] > 0
        # the server saw at least the requests the clients counted (plus warm-up and late ones)
        assert record["server"]["requests"] >= record["requests"]
    assert report["machine"]["cpu_cores"] >= 1 and "load average" in report["uptime_before"]
    figure = tmp_path / "transport-quick.png"
    assert figure.read_bytes()[:8] == PNG_MAGIC
    table = (tmp_path / "results-quick.md").read_text()
    assert table.count("| payload_sink |") == 2 and "| jet_tagger |" in table

    redrawn = tmp_path / "again"
    assert cli.main(["bench", "transport", "--replot", str(tmp_path / "results-quick.json"),
                     "-o", str(redrawn)]) == 0
    assert (redrawn / "results-quick.md").read_text() == table
    assert (redrawn / "transport-quick.png").read_bytes()[:8] == PNG_MAGIC
