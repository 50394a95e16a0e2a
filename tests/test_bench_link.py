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


def test_wire_sampler_reads_the_interface_from_its_own_process_on_the_callers_clock():
    import socket
    import threading
    import time

    from coffea_sonic.bench.link import WireSampler

    server = socket.create_server(("127.0.0.1", 0))
    received = []

    def drain():
        peer, _ = server.accept()
        with peer:
            while chunk := peer.recv(1 << 20):
                received.append(len(chunk))

    reader = threading.Thread(target=drain)
    reader.start()
    with WireSampler("lo") as wire:
        began = time.perf_counter()
        with socket.create_connection(server.getsockname()) as sock:
            sock.sendall(b"\0" * (4 << 20))
        reader.join(60)
        ended = time.perf_counter()
    server.close()
    assert not reader.is_alive() and sum(received) == 4 << 20
    times = [t for t, _ in wire.samples]
    assert times == sorted(times) and times[0] < began and times[-1] >= ended
    before = max(b for t, b in wire.samples if t <= began)
    assert wire.samples[-1][1] - before >= 4 << 20  # loopback counted every byte sent


def test_call_phases_counts_a_calls_bytes_from_the_last_reading_before_it():
    from coffea_sonic.bench.link import call_phases

    # readings only where the count changed: 1 MB before the call, nothing new until 2 ms in
    readings = [(0.0, 1_000_000), (0.002, 1_010_000), (0.003, 1_050_000), (0.010, 1_100_000)]
    calls = [(0.0, 0.0), (0.001, 0.012), (0.02, 0.02)]
    assert call_phases(calls, readings) == {"head_ms": 2.0, "sending_ms": 7.0, "tail_ms": 2.0}
