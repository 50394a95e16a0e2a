"""Shared-memory transport against the real embedded tritonserver: same answers as gRPC, no leaks.

Leaks are checked where they would show: ``/dev/shm`` (names this client created) and the
server's own list of registered regions (``SystemSharedMemoryStatus``), after a normal exit, an
uncaught exception, a client killed with SIGKILL, and a server killed with SIGKILL.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from coffea_sonic import zoo
from coffea_sonic.errors import ConfigurationError, ModelNotFoundError, ServerUnavailableError
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.transport import shm
from coffea_sonic.transport.channel import get_connection
from coffea_sonic.transport.codec import decode_response
from coffea_sonic.transport.shm import SystemShmTransport, region_prefix, select_transport
from helpers import grpc_reference, run_in_threads

ROWS = {"jet_tagger": 300, "particlenet_lite": 40, "emtrk_cnn": 12}


def outputs_of(name: str):
    return zoo.spec(name).outputs


def dev_shm_names(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(region_prefix(pid))]


def server_regions(address: str, pid: int) -> list[str]:
    from tritonclient.grpc import service_pb2

    status = get_connection(address).stub.SystemSharedMemoryStatus(
        service_pb2.SystemSharedMemoryStatusRequest(), timeout=10)
    return [name for name in status.regions if name.startswith(region_prefix(pid))]


@pytest.fixture(scope="module")
def transport(triton_server):
    with SystemShmTransport(triton_server.grpc_address) as opened:
        yield opened


@pytest.mark.parametrize("name", sorted(ROWS))
def test_shm_outputs_identical_to_plain_grpc(triton_server, transport, name):
    inputs = zoo.example_inputs(name, ROWS[name], seed=3)
    expected = grpc_reference(triton_server.grpc_address, name, inputs)
    got = transport.infer(name, "", inputs, outputs_of(name))
    assert sorted(got) == sorted(expected)
    for key in expected:
        assert got[key].dtype == expected[key].dtype and np.array_equal(got[key], expected[key])
    assert transport.stats["inline_requests"] == 0


def test_future_result_is_a_drop_in_for_the_grpc_future(triton_server, transport):
    inputs = zoo.example_inputs("jet_tagger", 50, seed=4)
    expected = grpc_reference(triton_server.grpc_address, "jet_tagger", inputs)
    called = threading.Event()
    future = transport.submit("jet_tagger", "", inputs, outputs_of("jet_tagger"))
    future.add_done_callback(lambda done: called.set())
    response = future.result(timeout=60)  # a ModelInferResponse, as stub.ModelInfer.future gives
    assert np.array_equal(decode_response(response)["probs"], expected["probs"])
    assert called.wait(5) and not future.cancelled() and future.exception() is None


def test_regions_are_reused_and_grown_on_demand(triton_server):
    with SystemShmTransport(triton_server.grpc_address, max_slots=1) as one_slot:
        small = zoo.example_inputs("jet_tagger", 10)
        one_slot.infer("jet_tagger", "", small, outputs_of("jet_tagger"))
        first = one_slot.regions()
        one_slot.infer("jet_tagger", "", small, outputs_of("jet_tagger"))
        assert one_slot.regions() == first  # reused
        big = zoo.example_inputs("jet_tagger", 60_000)  # 1.4 MB + outputs: over the 1 MiB minimum
        got = one_slot.infer("jet_tagger", "", big, outputs_of("jet_tagger"))
        assert got["probs"].shape == (60_000, 3)
        now = one_slot.regions()
        assert now != first and len(now) == 1  # replaced by a bigger one
        registered = server_regions(triton_server.grpc_address, os.getpid())
        assert now[0] in registered and first[0] not in registered
    assert now[0] not in server_regions(triton_server.grpc_address, os.getpid())


def test_concurrent_requests_from_threads_share_slots(triton_server):
    address = triton_server.grpc_address
    inputs = [zoo.example_inputs("jet_tagger", 500, seed=seed) for seed in range(6)]
    expected = [grpc_reference(address, "jet_tagger", x)["probs"] for x in inputs]
    results: dict[int, np.ndarray] = {}
    with SystemShmTransport(address, max_slots=3) as pooled:
        def work(index: int) -> None:
            for _ in range(3):
                results[index] = pooled.infer("jet_tagger", "", inputs[index],
                                              outputs_of("jet_tagger"))["probs"]

        run_in_threads(work, [(i,) for i in range(6)], timeout=120)
        assert len(pooled.regions()) <= 3
    for index, want in enumerate(expected):
        # concurrent requests may share a dynamic batch: onnxruntime's sums then differ in the
        # last bits, exactly as in-process inference on another batch size would
        np.testing.assert_allclose(results[index], want, rtol=1e-5, atol=1e-6)


def test_full_dev_shm_falls_back_to_the_grpc_message(triton_server, monkeypatch, caplog):
    def no_room(self, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm._Region, "__init__", no_room)
    inputs = zoo.example_inputs("jet_tagger", 40, seed=5)
    expected = grpc_reference(triton_server.grpc_address, "jet_tagger", inputs)
    with caplog.at_level(logging.WARNING, logger="coffea_sonic.transport.shm"):
        with SystemShmTransport(triton_server.grpc_address) as starved:
            got = starved.infer("jet_tagger", "", inputs, outputs_of("jet_tagger"))
            assert starved.stats["inline_requests"] == 1 and starved.regions() == []
    assert np.array_equal(got["probs"], expected["probs"])
    assert "Make /dev/shm larger" in caplog.text


def test_server_error_is_ours_and_the_slot_is_not_reused(triton_server):
    with SystemShmTransport(triton_server.grpc_address) as failing:
        with pytest.raises(ModelNotFoundError, match="no_such_model"):
            failing.infer("no_such_model", "", {"features": np.zeros((2, 6), np.float32)},
                          [("probs", "FP32", (3,))])
        assert failing.regions() == [] and failing.stats["regions_dropped"] == 1
        # like a gRPC future, exception() gives the server's RpcError (for retry classification)
        future = failing.submit("no_such_model", "", {"features": np.zeros((2, 6), np.float32)},
                                [("probs", "FP32", (3,))])
        assert future.exception(timeout=30).code().name == "NOT_FOUND"
        with pytest.raises(ModelNotFoundError):
            future.outputs()
        ok = failing.infer("jet_tagger", "", zoo.example_inputs("jet_tagger", 5),
                           outputs_of("jet_tagger"))
        assert ok["probs"].shape == (5, 3)


def test_select_transport_prefers_shm_for_a_server_on_this_host(triton_server):
    assert select_transport(triton_server.grpc_address) == "shm"
    assert select_transport(f"localhost:{triton_server.ports['grpc']}", "shm") == "shm"
    assert select_transport(triton_server.grpc_address, "grpc") == "grpc"
    assert select_transport("192.0.2.1:8001") == "grpc"  # TEST-NET: never this host
    with pytest.raises(ConfigurationError, match="not a local address"):
        select_transport("192.0.2.1:8001", "shm")
    before = set(server_regions(triton_server.grpc_address, os.getpid()))
    shm._probe_cache.clear()
    shm._selections.clear()
    assert select_transport(triton_server.grpc_address) == "shm"
    assert set(server_regions(triton_server.grpc_address, os.getpid())) == before  # probe cleaned up


CLIENT = textwrap.dedent("""
    import json, os, signal, sys
    from coffea_sonic import zoo
    from coffea_sonic.transport.shm import SystemShmTransport
    address, ending = sys.argv[1], sys.argv[2]
    transport = SystemShmTransport(address)
    out = transport.infer("jet_tagger", "", zoo.example_inputs("jet_tagger", 100),
                          zoo.spec("jet_tagger").outputs)
    print(json.dumps({"pid": os.getpid(), "regions": transport.regions(),
                      "rows": len(out["probs"])}), flush=True)
    if ending == "exception":
        raise RuntimeError("analysis failed after inference")
    if ending == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
""")


def run_client(address: str, ending: str) -> tuple[dict, subprocess.CompletedProcess]:
    done = subprocess.run([sys.executable, "-c", CLIENT, address, ending], capture_output=True,
                          text=True, timeout=120)
    first_line = done.stdout.splitlines()[0] if done.stdout else ""
    assert first_line, done.stderr
    return json.loads(first_line), done


@pytest.mark.parametrize("ending", ["normal", "exception"])
def test_regions_gone_after_client_exits(triton_server, ending):
    report, done = run_client(triton_server.grpc_address, ending)
    assert report["rows"] == 100 and len(report["regions"]) == 1
    assert done.returncode == (0 if ending == "normal" else 1)
    assert dev_shm_names(report["pid"]) == []
    assert server_regions(triton_server.grpc_address, report["pid"]) == []


def test_regions_of_a_killed_client_are_swept(triton_server):
    report, done = run_client(triton_server.grpc_address, "sigkill")
    assert done.returncode == -signal.SIGKILL
    # the name was unlinked right after registration: nothing of it is left in /dev/shm
    assert dev_shm_names(report["pid"]) == []
    # the server still maps it until someone tells it the client is gone
    assert server_regions(triton_server.grpc_address, report["pid"]) == report["regions"]
    removed = shm.sweep_stale_regions(triton_server.grpc_address)
    assert report["regions"][0] in removed
    assert server_regions(triton_server.grpc_address, report["pid"]) == []


def test_regions_gone_after_server_killed_and_error_is_clear():
    server = LocalTritonServer(models=["jet_tagger"], device="cpu").start()
    try:
        transport = SystemShmTransport(server.grpc_address)
        inputs = zoo.example_inputs("jet_tagger", 64)
        transport.infer("jet_tagger", "", inputs, outputs_of("jet_tagger"))
        assert len(transport.regions()) == 1
        os.kill(server.pid, signal.SIGKILL)
        server.process.wait(30)
        with pytest.raises(ServerUnavailableError, match=server.grpc_address):
            transport.infer("jet_tagger", "", inputs, outputs_of("jet_tagger"), timeout_s=10)
        assert transport.regions() == []  # the failed request's region was dropped
        transport.close()
        assert dev_shm_names(os.getpid()) == []
    finally:
        server.stop()
