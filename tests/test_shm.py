"""Shared memory as the client meets it, against real tritonservers.

Every zoo model answers through system shared memory exactly what plain gRPC answers;
``TritonModel(transport="auto")`` picks shared memory for a server on this host and gRPC for
any other, and ``transport="shm"`` for a remote address is a configuration error; a server
killed under a client fails its next request clearly (a retryable ``down`` naming the server,
``ServerUnavailableError`` for the user) and leaves no region behind.

The transport's own mechanics (slots, threads, a full ``/dev/shm``, cancellation, regions of
ended clients, the probe, CUDA) are in ``test_shm_transport.py``.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from coffea_sonic import zoo
from coffea_sonic.core.endpoint import ServerSettings
from coffea_sonic.errors import ConfigurationError, ServerUnavailableError
from coffea_sonic.model import TritonModel
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.transport.base import InferRequest
from coffea_sonic.transport.errors import TransportError, to_sonic_error
from coffea_sonic.transport.registry import open_transport
from coffea_sonic.transport.shm import SystemShmTransport, region_prefix
from helpers import grpc_reference

ROWS = {"jet_tagger": 300, "particlenet_lite": 40, "emtrk_cnn": 12}
TEST_NET = "192.0.2.1:8001"  # RFC 5737: never this host, and nothing needs to answer there


def request(name: str, rows: int, seed: int = 0, **options) -> InferRequest:
    return InferRequest(name, "", zoo.example_inputs(name, rows, seed),
                        zoo.declared_info(name).outputs, rows=rows, **options)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_zoo_model_answers_as_over_plain_grpc(triton_server, name):
    sent = request(name, ROWS[name], seed=3)
    expected = grpc_reference(triton_server.grpc_address, name, sent.inputs)
    with SystemShmTransport(ServerSettings(triton_server.grpc_address)) as transport:
        answer = transport.infer(sent)
        assert transport.stats["shm_requests"] == 1 and transport.stats["inline_requests"] == 0
    assert sorted(answer.outputs) == sorted(expected)
    for key, want in expected.items():
        got = answer.outputs[key]
        assert got.dtype == want.dtype and np.array_equal(got, want), key


def test_auto_picks_shared_memory_for_a_server_on_this_host(triton_server):
    inputs = zoo.example_inputs("jet_tagger", 200, seed=4)
    local = TritonModel(triton_server.url("jet_tagger"), transport="auto")
    assert local.transport_kind == "shm"
    shm = open_transport(local.servers[0], "shm")  # the one the router chose, shared per process
    before = shm.stats["shm_requests"]
    got = local(inputs)
    assert shm.stats["shm_requests"] > before
    np.testing.assert_array_equal(
        got["probs"], grpc_reference(triton_server.grpc_address, "jet_tagger", inputs)["probs"])
    by_name = f"triton+grpc://localhost:{triton_server.ports['grpc']}/jet_tagger"
    assert TritonModel(by_name, transport="shm").transport_kind == "shm"
    assert TritonModel(triton_server.url("jet_tagger"), transport="grpc").transport_kind == "grpc"


def test_auto_picks_grpc_for_a_server_elsewhere_and_shm_demanded_there_is_an_error():
    url = f"triton+grpc://{TEST_NET}/jet_tagger"
    assert TritonModel(url, transport="auto").transport_kind == "grpc"
    with pytest.raises(ConfigurationError, match=f"{TEST_NET}.*not on this host"):
        TritonModel(url, transport="shm").transport_kind


def test_a_killed_server_fails_clearly_and_leaves_no_region():
    server = LocalTritonServer(models=["jet_tagger"], device="cpu").start()
    try:
        transport = SystemShmTransport(ServerSettings(server.grpc_address))
        transport.infer(request("jet_tagger", 64))
        assert len(transport.regions()) == 1
        os.kill(server.pid, signal.SIGKILL)
        server.process.wait(30)
        error = transport.submit(request("jet_tagger", 64, timeout_s=10)).exception(60)
        assert isinstance(error, TransportError) and error.kind == "down", error
        assert error.retryable and server.grpc_address in str(error)
        shown = to_sonic_error(error, model="jet_tagger")
        assert isinstance(shown, ServerUnavailableError) and server.grpc_address in str(shown)
        assert transport.regions() == []  # the failed request's slot was dropped
        transport.close()
        assert not [name for name in os.listdir("/dev/shm") if name.startswith(region_prefix())]
    finally:
        server.stop()


def test_a_restarted_server_forgets_our_regions_once_however_many_requests_were_in_flight():
    """Every request in flight on a slot registered with the old process meets the forgetting;
    it counts once (a server may forget our regions a few times before it gets plain requests),
    so a call that asked for shared memory keeps it and gets every row."""
    server = LocalTritonServer(models=["jet_tagger"], device="cpu").start()
    restarted = None
    try:
        model = TritonModel(server.url("jet_tagger"), transport="shm", max_request_bytes=24 * 100,
                            max_in_flight=8)
        inputs = zoo.example_inputs("jet_tagger", 1_600, seed=5)
        expected = model(inputs)["probs"]
        transport = open_transport(model.servers[0], "shm")
        port = server.ports["grpc"]
        server.stop()
        restarted = LocalTritonServer(models=["jet_tagger"], device="cpu", grpc_port=port).start()
        np.testing.assert_array_equal(model(inputs)["probs"], expected)
        endpoint = model._get_runtime().router.endpoints[0]
        assert transport.stats["shm_region_errors"] >= 1 and endpoint.transports.reprobes == 1
        assert not endpoint.transports.shm_off
    finally:
        server.stop()
        if restarted is not None:
            restarted.stop()
