"""The gRPC path on a real server: requests spread over several connections, answered exactly."""

from __future__ import annotations

import numpy as np
import pytest

from coffea_sonic.bench.passthrough import PASSTHROUGH, passthrough_inputs
from coffea_sonic.core.endpoint import ServerSettings
from coffea_sonic.core.tensors import TensorInfo
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.model import TritonModel
from coffea_sonic.transport.base import InferRequest
from coffea_sonic.transport.errors import TransportError
from coffea_sonic.transport.grpc import GrpcTransport, channel
from coffea_sonic.transport.grpc.transport import default_connections
from helpers import wait_for

OUTPUT = (TensorInfo("y", "FP32", (2,)),)


def _request(rows: int, seed: int) -> InferRequest:
    return InferRequest(PASSTHROUGH, "", passthrough_inputs(rows, seed), OUTPUT, rows=rows)


def test_requests_are_spread_over_every_connection_and_answered_exactly(passthrough_server):
    address = passthrough_server.grpc_address
    transport = GrpcTransport(ServerSettings(address), connections=3)
    before = {key for key, _ in channel._pool.items() if key[0] == address}
    futures = [(seed, transport.submit(_request(1000, seed))) for seed in range(6)]
    for seed, future in futures:
        expected = passthrough_inputs(1000, seed)["x"][:, :2]
        np.testing.assert_array_equal(future.result(60).outputs["y"], expected)
    opened = {key for key, _ in channel._pool.items() if key[0] == address} - before
    # index 0 may have been opened before, by another test's transport to this server
    assert {1, 2} <= {key[-1] for key in opened} <= {0, 1, 2}


def test_a_model_over_several_connections_returns_every_row(passthrough_server, monkeypatch):
    monkeypatch.setenv("COFFEA_SONIC_GRPC_CONNECTIONS", "2")
    model = TritonModel(passthrough_server.url(PASSTHROUGH), transport="grpc",
                        max_request_bytes=64 * 1000)
    inputs = passthrough_inputs(10_000, seed=3)
    np.testing.assert_array_equal(model(inputs)["y"], inputs["x"][:, :2])
    handles = [model.infer_async(passthrough_inputs(5000, seed)) for seed in range(4)]
    for seed, handle in enumerate(handles):
        np.testing.assert_array_equal(handle.result(60)["y"],
                                      passthrough_inputs(5000, seed)["x"][:, :2])


@pytest.mark.parametrize("value", ["0", "9", "two"])
def test_a_bad_connection_count_is_a_configuration_error(value, monkeypatch):
    monkeypatch.setenv("COFFEA_SONIC_GRPC_CONNECTIONS", value)
    with pytest.raises(ConfigurationError, match="COFFEA_SONIC_GRPC_CONNECTIONS"):
        default_connections()


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_compressed_requests_are_answered_exactly_over_grpc_and_http(passthrough_server,
                                                                      monkeypatch, compression):
    from coffea_sonic.transport.http import HttpTransport

    monkeypatch.setenv("COFFEA_SONIC_COMPRESSION", compression.upper())
    grpc_transport = GrpcTransport(ServerSettings(passthrough_server.grpc_address))
    http_transport = HttpTransport(ServerSettings(passthrough_server.http_address, "http"))
    assert grpc_transport.compression == http_transport.compression == compression
    for transport in (grpc_transport, http_transport):
        request = _request(20_000, seed=5)
        answer = transport.submit(request).result(60)
        np.testing.assert_array_equal(answer.outputs["y"], request.inputs["x"][:, :2])
    http_transport.close()


def test_an_unknown_compression_is_a_configuration_error(monkeypatch):
    monkeypatch.setenv("COFFEA_SONIC_COMPRESSION", "zstd")
    with pytest.raises(ConfigurationError, match="compression must be one of none, gzip"):
        GrpcTransport(ServerSettings("127.0.0.1:1"))


def test_shared_memory_survives_another_client_unregistering_every_region(passthrough_server):
    from tritonclient.grpc import service_pb2

    model = TritonModel(passthrough_server.url(PASSTHROUGH), transport="shm")
    inputs = passthrough_inputs(20_000, seed=7)
    np.testing.assert_array_equal(model(inputs)["y"], inputs["x"][:, :2])
    control = GrpcTransport(ServerSettings(passthrough_server.grpc_address))

    def unregister_every_region() -> bool:
        # what perf_analyzer does when it ends: an unregister without a name drops every region
        try:
            control.rpc("SystemSharedMemoryUnregister",
                        service_pb2.SystemSharedMemoryUnregisterRequest(), 30)
        except TransportError as error:
            # Triton lets go of an answered request's regions a moment after its answer
            if "Failed to unregister" not in error.detail:
                raise
            return False
        return True

    wait_for(unregister_every_region, timeout=30,
             what="the server to let go of the answered request's regions and drop them all")
    for seed in range(3):
        inputs = passthrough_inputs(20_000, seed=seed)
        np.testing.assert_array_equal(model(inputs)["y"], inputs["x"][:, :2])
    assert model.transport_kind == "shm"
    status = control.rpc("SystemSharedMemoryStatus",
                         service_pb2.SystemSharedMemoryStatusRequest(), 30)
    assert status.regions, "the model registered new regions"
