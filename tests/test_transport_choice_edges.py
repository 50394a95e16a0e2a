"""Edges of the transport choice (coffea_sonic.transport.choice) that need no server.

A server off this host (192.0.2.1, a documentation address) never gets shared memory, so the
choice falls back without sending anything; transports open lazily, so nothing connects.
"""
from __future__ import annotations

import logging

import pytest

from coffea_sonic.core.endpoint import ServerSettings
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.transport.choice import MAX_REPROBES, ServerTransports

REMOTE = ServerSettings("192.0.2.1:8001")
REMOTE_HTTP = ServerSettings("192.0.2.1:8000", protocol="http")


def test_a_remote_server_gets_the_urls_protocol_quietly_under_auto(caplog):
    choice = ServerTransports(REMOTE)
    with caplog.at_level(logging.INFO, logger="coffea_sonic.transport.choice"):
        assert choice.data_transport().name == "grpc"
        assert choice.kind() == "grpc" and choice.kind(gpu_model=True) == "grpc"
    assert choice.shm_off == "the server is not on this host"
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert choice.data_transport() is choice.data


def test_asking_for_shared_memory_with_a_remote_server_warns_then_refuses(caplog):
    choice = ServerTransports(REMOTE, "shm")
    with caplog.at_level(logging.INFO, logger="coffea_sonic.transport.choice"):
        with pytest.raises(ConfigurationError, match="transport='shm': cannot use shared memory "
                                                     "with 192.0.2.1:8001 \\(the server is not on this host\\)"):
            choice.data_transport()
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    with pytest.raises(ConfigurationError, match="transport='cuda'"):
        ServerTransports(REMOTE, "cuda").data_transport()


def test_http_needs_an_http_url_and_an_http_url_is_always_plain():
    with pytest.raises(ConfigurationError, match="transport='http' needs triton\\+http:// URLs"):
        ServerTransports(REMOTE, "http").data_transport()
    assert ServerTransports(REMOTE_HTTP, "http").data_transport().name == "http"
    auto = ServerTransports(REMOTE_HTTP)
    assert auto.data_transport().name == "http" and auto.shm_off == ""
    grpc = ServerTransports(REMOTE, "grpc")
    assert grpc.data_transport().name == "grpc" and grpc.shm_off == ""
    assert grpc.control().name == "grpc" and grpc.plain.name == "grpc"


def test_a_factory_carries_control_calls_and_requests():
    made: list[ServerSettings] = []

    def factory(settings: ServerSettings):
        made.append(settings)
        return ServerTransports(settings, "grpc").plain

    choice = ServerTransports(REMOTE, factory)
    assert choice.control().name == "grpc" and choice.data_transport(gpu_model=True).name == "grpc"
    assert made == [REMOTE, REMOTE]


def test_shared_memory_is_turned_off_once_with_the_first_reason(caplog):
    choice = ServerTransports(REMOTE, "grpc")
    with caplog.at_level(logging.INFO, logger="coffea_sonic.transport.choice"):
        choice.disable_shm("first")
        choice.disable_shm("second")
    assert choice.shm_off == "first" and len(caplog.records) == 1
    assert caplog.records[0].levelno == logging.WARNING
    other = ServerTransports(REMOTE, "grpc")
    other.disable_shm("", quiet=True)
    assert other.shm_off == "shared memory failed"


def test_a_server_that_forgets_regions_with_shared_memory_off_is_not_probed_again():
    choice = ServerTransports(REMOTE, "grpc")
    choice.disable_shm("off", quiet=True)
    for _ in range(MAX_REPROBES + 1):
        choice.region_forgotten("unknown region")
    assert choice.reprobes == MAX_REPROBES + 1 and choice.shm_off == "off"
    assert MAX_REPROBES == 3


def test_a_choice_once_made_is_kept_and_gpu_models_over_grpc_never_try_cuda():
    choice = ServerTransports(REMOTE)
    choice.data_transport()
    kept = ServerTransports(ServerSettings("192.0.2.2:8001"), "grpc").plain
    choice.data = kept
    assert choice.data_transport() is kept and choice.data_transport(gpu_model=True) is kept
    assert choice.kind(gpu_model=True) == "grpc" and choice.cuda_off == "" and choice.cuda is None
