"""``coffea-sonic bench link``: a default TritonModel through a shaped lab link, run tiny for real
(network namespaces, a tritonserver on the lab host, the relay adding a round trip). Needs root."""

from __future__ import annotations

import json

import pytest

from coffea_sonic.bench.commands import run_scenario
from coffea_sonic.netlab import missing_requirements

pytestmark = [pytest.mark.netlab,
              pytest.mark.skipif(bool(missing_requirements()), reason=missing_requirements())]


def test_link_bench_counts_each_calls_bytes_on_the_shaped_link_directly_and_through_the_relay(
        tmp_path):
    code = run_scenario("link", ["--links", "1000/0,1000/10", "--seconds", "0.4",
                                 "--rows", "20000", "--no-compression", "-o", str(tmp_path)])

    assert code == 0
    report = json.loads((tmp_path / "link.json").read_text())
    cases = report["cases"]
    assert [(c["server"], c["rtt_ms"], c["mode"], c["rows"]) for c in cases] == [
        (server, rtt, mode, rows) for server in ("lab", "serve") for rtt in (0.0, 10.0)
        for mode, rows in (("back to back", 5000), ("back to back", 20000),
                           ("2 calls in flight (infer_async)", 20000), ("back to back", 40000))]
    for case in cases:
        assert case["transport"] == "grpc"  # the lab host has its own /dev/shm
        assert case["calls_done"] >= 1 and case["raw_tcp_Bps"] > 0
        # every call's tensors crossed the caller's interface (plus gRPC's framing)
        assert case["wire_Bps"] >= 0.95 * case["payload_Bps"] > 0
        assert case["compression"] == "none"
    assert all("sending_ms" in c for c in cases if c["mode"] == "back to back"
               and c["calls_done"] >= 3)
    table = (tmp_path / "link.md").read_text()
    assert "| lab launcher | 1 Gb/s | 10 ms | none |" in table
    assert "| coffea-sonic serve | 1 Gb/s | 10 ms | none |" in table
    assert report["compressibility"] == {}
