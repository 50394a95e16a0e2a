"""Settings the docs document (docs/facility/settings.md), each on the real path: a token file,
the restricted-protocol key, the fallback setting, mutual TLS, the server list from Dask's config,
``check`` against a server that never answers, and a server that comes back from a restart serving
another signature."""

from __future__ import annotations

import logging
import os
import pickle
import signal

import numpy as np
import pytest

from coffea_sonic import zoo
from coffea_sonic.engines import CpuEngine
from coffea_sonic.errors import ServerUnavailableError, SonicError
from coffea_sonic.facility.check import check_server, render_reports
from coffea_sonic.facility.gateway import TokenGateway
from coffea_sonic.model import TritonModel
from coffea_sonic.server import LocalTritonServer, free_port, write_repository
from conftest import tls_arguments
from helpers import wait_for

MODEL = "jet_tagger"
TOKEN_ENV = "COFFEA_SONIC_SETTINGS_TEST_TOKEN"
TOKEN = "token-from-a-file-that-must-never-be-printed"
KEY_ENV = "COFFEA_SONIC_SETTINGS_TEST_PROTOCOL_KEY"


@pytest.fixture(scope="module")
def inputs():
    return zoo.example_inputs(MODEL, 40, seed=5)


@pytest.fixture(scope="module")
def expected(inputs):
    return CpuEngine(MODEL, threads=1)(inputs)["probs"]


@pytest.fixture
def gateway(jet_tagger_server, monkeypatch):
    """A bearer-token gateway in front of the session's jet_tagger server."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with TokenGateway(jet_tagger_server.grpc_address, token_env=TOKEN_ENV) as running:
        yield running


def test_token_file_setting_reaches_the_gateway_and_never_leaks(gateway, monkeypatch, tmp_path,
                                                                 inputs, expected, caplog):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    monkeypatch.setenv("COFFEA_SONIC_TOKEN_FILE", str(token_file))
    model = TritonModel(gateway.url(MODEL))
    np.testing.assert_allclose(model(inputs)["probs"], expected, atol=1e-5)
    assert gateway.accepted > 0
    assert TOKEN.encode() not in pickle.dumps(model) and TOKEN not in repr(model)
    # the check reads the same setting, and --token-file names the file outright
    assert check_server(gateway.url(MODEL), pings=1).finding("auth").status == "ok"
    monkeypatch.delenv("COFFEA_SONIC_TOKEN_FILE")
    report = check_server(gateway.url(MODEL), pings=1, token_file=str(token_file))
    assert report.ok and TOKEN not in render_reports([report]), render_reports([report])
    # a file with another token is refused, and neither token is printed
    token_file.write_text("another-" + TOKEN[::-1])
    monkeypatch.setenv("COFFEA_SONIC_TOKEN_FILE", str(token_file))
    with caplog.at_level(logging.DEBUG, logger="coffea_sonic"):
        with pytest.raises(SonicError) as caught:
            TritonModel(gateway.url(MODEL))(inputs)
    text = str(caught.value) + " ".join(record.getMessage() for record in caplog.records)
    assert "UNAUTHENTICATED" in text and TOKEN not in text and TOKEN[::-1] not in text


def test_protocol_key_settings_open_a_restricted_server(restricted_tritonserver, restriction,
                                                        monkeypatch, inputs, expected):
    url = restricted_tritonserver.url(MODEL)
    without = TritonModel(url)
    np.testing.assert_allclose(without(inputs)["probs"], expected, atol=1e-5)
    assert without.transport_kind == "grpc"  # shared memory is behind the key
    with pytest.raises(SonicError, match="restrict"):
        without.server_statistics()
    monkeypatch.setenv("COFFEA_SONIC_PROTOCOL_KEY_NAME", restriction.key)
    monkeypatch.setenv("COFFEA_SONIC_PROTOCOL_KEY_ENV", KEY_ENV)
    monkeypatch.setenv(KEY_ENV, restriction.value)
    keyed = TritonModel(url)
    np.testing.assert_allclose(keyed(inputs)["probs"], expected, atol=1e-5)
    assert keyed.transport_kind == "shm"
    assert keyed.server_statistics().inference_count >= len(inputs["features"])
    assert restriction.value.encode() not in pickle.dumps(keyed)
    # the name alone is a configuration mistake, said before anything is sent
    monkeypatch.delenv("COFFEA_SONIC_PROTOCOL_KEY_ENV")
    with pytest.raises(SonicError, match="protocol_key_env"):
        TritonModel(url)(inputs)


def test_fallback_setting_serves_in_process_when_no_server_answers(monkeypatch, inputs, expected):
    url = f"triton+grpc://127.0.0.1:{free_port()}/{MODEL}"
    monkeypatch.setenv("COFFEA_SONIC_FALLBACK", "cpu")
    model = TritonModel(url, connect_timeout_s=0.5)
    np.testing.assert_allclose(model(inputs)["probs"], expected, atol=1e-5)
    assert model.stats.fallback_rows == len(inputs["features"])
    monkeypatch.setenv("COFFEA_SONIC_FALLBACK", "off")
    off = TritonModel(url, connect_timeout_s=0.5)
    with pytest.raises(ServerUnavailableError, match="no server reachable"):
        off(inputs)
    assert off.stats.fallback_rows == 0


def test_mutual_tls_settings_give_the_client_certificate(certificates, monkeypatch, inputs,
                                                         expected):
    with LocalTritonServer(models=[MODEL], device="cpu",
                           extra_args=tls_arguments(certificates, mutual=True)) as server:
        url = server.url(MODEL).replace("triton+grpc://", "triton+grpcs://")
        monkeypatch.setenv("COFFEA_SONIC_CA_FILE", certificates["ca"])
        anonymous = TritonModel(url, connect_timeout_s=2, fallback="off")
        with pytest.raises(SonicError, match=server.grpc_address):
            anonymous(inputs)
        monkeypatch.setenv("COFFEA_SONIC_CERT_FILE", certificates["client_cert"])
        monkeypatch.setenv("COFFEA_SONIC_KEY_FILE", certificates["client_key"])
        identified = TritonModel(url)
        np.testing.assert_allclose(identified(inputs)["probs"], expected, atol=1e-5)
        blob = pickle.dumps(identified)  # paths travel, not the key itself
        assert open(certificates["client_key"], "rb").read() not in blob
        assert pickle.loads(blob)(inputs)["probs"].shape == expected.shape


def test_server_list_from_dask_config_reaches_every_worker(triton_server, jet_tagger_server,
                                                           inputs, expected):
    import dask
    from distributed import Client, LocalCluster

    servers = [triton_server.grpc_address, jet_tagger_server.grpc_address]
    declared = f"triton+grpc://127.0.0.1:{free_port()}/{MODEL}"  # nothing listens there

    def on_a_worker():
        from coffea_sonic import config

        model = TritonModel(config.model_urls(MODEL, declared), max_request_bytes=24 * 4)
        probs = model(inputs)["probs"]
        return probs, model.addresses, [e.requests for e in model._get_runtime().router.endpoints]

    # the config is set in the driver before the workers start, as dask.config.set does for a
    # LocalCluster (a facility sets it in its Dask configuration files instead)
    with dask.config.set({"coffea_sonic.servers": servers}):
        with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                          dashboard_address=":0") as cluster, Client(cluster) as client:
            with dask.config.set({"coffea_sonic.servers": None}):  # the worker's copy decides
                probs, addresses, requests = client.submit(on_a_worker, pure=False).result(120)
    np.testing.assert_allclose(probs, expected, atol=1e-5)
    assert addresses == servers and all(count > 0 for count in requests), requests


def test_check_says_no_answer_within_the_timeout_when_the_server_hangs(monkeypatch):
    # a gateway that answers gRPC in front of a server that stopped answering (SIGSTOP)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with LocalTritonServer(models=[MODEL], device="cpu") as server, \
            TokenGateway(server.grpc_address, token_env=TOKEN_ENV) as gateway:
        os.kill(server.pid, signal.SIGSTOP)
        try:
            report = check_server(gateway.url(MODEL), timeout_s=2, token_env=TOKEN_ENV)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        finding = report.finding("server")
        assert finding.status == "fail", render_reports([report])
        assert "no answer within 2 s" in finding.summary and "overloaded or hanging" in finding.advice
        assert check_server(gateway.url(MODEL), timeout_s=30, token_env=TOKEN_ENV).ok


def test_restarted_server_with_another_signature_is_not_used_for_that_model(
        tmp_path, jet_tagger_server, inputs, expected):
    # the same name, another signature: 7 features instead of 6
    other = write_repository(tmp_path / "other", [MODEL])
    config = other / MODEL / "config.pbtxt"
    text = config.read_text()
    assert text.count("dims: 6") == 1, text
    config.write_text(text.replace("dims: 6", "dims: 7"))
    first = LocalTritonServer(models=[MODEL], device="cpu").start()
    port = first.ports["grpc"]
    model = TritonModel([first.url(MODEL), jet_tagger_server.url(MODEL)],
                        max_request_bytes=24 * 10, retry={"quarantine_s": 0.2,
                                                          "max_quarantine_s": 1.0})
    restarted = None
    try:
        model(inputs)
        router = model._get_runtime().router
        assert all(endpoint.requests > 0 for endpoint in router.endpoints)
        first.stop()
        np.testing.assert_allclose(model(inputs)["probs"], expected, atol=1e-5)  # one server
        assert not router.endpoints[0].healthy
        restarted = LocalTritonServer(repository=other, device="cpu", grpc_port=port).start()
        wait_for(lambda: router.endpoints[0].healthy and MODEL in router.endpoints[0].incompatible,
                 timeout=30, interval=0.1,
                 what=lambda: f"the restarted server re-checked: {router.describe(MODEL)}")
        assert "checksum" in router.endpoints[0].incompatible[MODEL]
        served_before = router.endpoints[0].requests
        np.testing.assert_allclose(model(inputs)["probs"], expected, atol=1e-5)
        assert router.endpoints[0].requests == served_before  # all went to the other server
        assert TritonModel(restarted.url(MODEL)).server_statistics().success_count == 0
    finally:
        first.stop()
        if restarted is not None:
            restarted.stop()
