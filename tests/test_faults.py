"""Fault injection on the real path (loopback only): servers killed, down, slow, overloaded,
restarted; TLS and bearer tokens. No event may be lost, and outputs must equal a clean run."""

from __future__ import annotations

import importlib.util
import logging
import os
import pickle
import signal
from pathlib import Path

import numpy as np
import pytest

from coffea_sonic import zoo
from coffea_sonic.errors import MissingDependencyError, ServerUnavailableError, SonicError
from coffea_sonic.facility.gateway import TokenGateway
from coffea_sonic.model import TritonModel
from coffea_sonic.server import LocalTritonServer, free_port
from coffea_sonic.server.repository import config_text, model_config
from coffea_sonic.core import Secret
from helpers import CheckedThread, assert_sent_over, reference_engine, wait_for

# client-level suite: every test runs over gRPC and over shared memory
pytestmark = pytest.mark.usefixtures("each_transport")

TOLERANCE = 1e-5
#: a python-backend jet_tagger with the zoo signature that sleeps ``delay_s`` per execution
SLOW_MODEL_PY = '''
import json, os, time
import numpy as np
import onnxruntime
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.delay_s = float(parameters.get("delay_s", "0"))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        here = os.path.dirname(os.path.abspath(__file__))
        self.session = onnxruntime.InferenceSession(
            os.path.join(here, "model.onnx"), sess_options=options,
            providers=["CPUExecutionProvider"])

    def execute(self, requests):
        time.sleep(self.delay_s)
        responses = []
        for request in requests:
            features = pb_utils.get_input_tensor_by_name(request, "features").as_numpy()
            (probs,) = self.session.run(["probs"], {"features": features})
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("probs", probs.astype(np.float32))]))
        return responses
'''


def _slow_repository(dest: Path, delay_s: float, max_queue_size: int | None = None) -> Path:
    version_dir = dest / "jet_tagger" / "1"
    version_dir.mkdir(parents=True)
    config = model_config("jet_tagger", max_queue_size=max_queue_size)
    config.parameters["delay_s"].string_value = str(delay_s)
    (dest / "jet_tagger" / "config.pbtxt").write_text(config_text(config))
    (version_dir / "model.py").write_text(SLOW_MODEL_PY)
    (version_dir / "model.onnx").symlink_to(zoo.onnx_path("jet_tagger"))
    return dest


def _jet_server(**options) -> LocalTritonServer:
    if "repository" not in options:
        options.setdefault("models", ["jet_tagger"])
    return LocalTritonServer(device="cpu", **options).start()


@pytest.fixture(scope="module")
def engine():
    return reference_engine("jet_tagger", threads=1)


@pytest.fixture(scope="module")
def chunks():
    """Twelve chunks of jets, as a small analysis would send them."""
    return [zoo.example_inputs("jet_tagger", 1500, seed=seed) for seed in range(12)]


def _run(model: TritonModel, chunks, during=None) -> list[np.ndarray]:
    outputs = []
    for index, chunk in enumerate(chunks):
        if during is not None:
            during(index)
        outputs.append(model(chunk)["probs"])
    return outputs


def _assert_same(outputs, expected) -> None:
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)


def _requests_served(server: LocalTritonServer) -> int:
    return TritonModel(server.url("jet_tagger")).server_statistics().success_count


def test_kill_9_one_of_two_servers_mid_run_completes_with_clean_outputs(chunks, engine):
    first, second = _jet_server(), _jet_server()
    try:
        clean = [engine(chunk)["probs"] for chunk in chunks]
        model = TritonModel([first.url("jet_tagger"), second.url("jet_tagger")],
                            max_request_bytes=24 * 250, timeout_s=20)

        def kill_when_busy() -> None:
            wait_for(lambda: model.stats.requests >= 10, timeout=120, interval=0.005,
                     what="the run to have sent 10 requests")
            os.kill(first.pid, signal.SIGKILL)

        killer = CheckedThread(kill_when_busy)
        killer.start()
        outputs = _run(model, chunks)
        killer.finish(timeout=10)  # the kill happened mid-run (or its failure is raised here)
        _assert_same(outputs, clean)
        stats = model.stats
        assert stats.rows == sum(len(chunk["features"]) for chunk in chunks)
        assert stats.failed_requests >= 1 and stats.retries >= 1 and stats.fallback_rows == 0
        router = model._get_runtime().router
        assert [e.healthy for e in router.endpoints] == [False, True]
    finally:
        first.stop()
        second.stop()


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None,
                    reason="fallback='cpu' runs onnxruntime in this process: the onnx extra")
def test_all_servers_down_with_fallback_completes_with_same_outputs(chunks, engine, caplog):
    first, second = _jet_server(), _jet_server()
    urls = [first.url("jet_tagger"), second.url("jet_tagger")]
    try:
        model = TritonModel(urls, fallback="cpu", retry={"total_s": 5})
        clean = _run(model, chunks[:3])
    finally:
        os.kill(first.pid, signal.SIGKILL)
        os.kill(second.pid, signal.SIGKILL)
        first.stop()
        second.stop()
    from coffea_sonic import fallback as fallback_module

    fallback_module._last_warning.clear()  # warned at most every 30 s: an earlier test warned
    with caplog.at_level(logging.WARNING, logger="coffea_sonic"):
        after = _run(model, chunks[:3])
    _assert_same(after, clean)
    assert model.stats.fallback_rows == 3 * 1500 and model.stats.fallback_calls >= 3
    assert any("FALLBACK" in record.getMessage() for record in caplog.records)
    # a fresh process-level model that never saw a server also completes (signature from the zoo)
    fresh = TritonModel(urls, fallback="cpu", connect_timeout_s=1)
    _assert_same([fresh(chunks[0])["probs"]], [engine(chunks[0])["probs"]])


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is not None,
                    reason="a client-only install (no onnx extra) lacks onnxruntime; this one has it")
def test_fallback_cpu_without_onnxruntime_names_the_extra_to_install(chunks):
    dead = [f"triton+grpc://127.0.0.1:{free_port()}/jet_tagger"]
    model = TritonModel(dead, fallback="cpu", connect_timeout_s=1, retry={"total_s": 1})
    with pytest.raises(MissingDependencyError) as caught:
        model(chunks[0])
    assert "needs onnxruntime" in str(caught.value)
    assert "pip install 'coffea-sonic[onnx]'" in str(caught.value)


def test_all_servers_down_without_fallback_names_every_server_tried(chunks):
    server = _jet_server()
    dead_address = f"127.0.0.1:{free_port()}"
    model = TritonModel([server.url("jet_tagger"), f"triton+grpc://{dead_address}/jet_tagger"],
                        fallback="off", retry={"total_s": 2.0}, connect_timeout_s=1)
    model(chunks[0])
    server.stop()
    with pytest.raises(ServerUnavailableError) as caught:
        model(chunks[1])
    message = str(caught.value)
    assert server.grpc_address in message and dead_address in message
    assert "fallback='cpu'" in message and "no server could serve" in message


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    """jet_tagger taking 3 s per execution (for every transport of the module)."""
    repository = _slow_repository(tmp_path_factory.mktemp("slow"), delay_s=3.0)
    with LocalTritonServer(repository=repository, device="cpu") as server:
        yield server


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory):
    """jet_tagger taking 50 ms per execution with room for one queued request."""
    repository = _slow_repository(tmp_path_factory.mktemp("busy"), delay_s=0.05,
                                  max_queue_size=1)
    with LocalTritonServer(repository=repository, device="cpu") as server:
        yield server


def test_server_slower_than_the_timeout_is_retried_elsewhere(slow_server, jet_tagger_server,
                                                             chunks, engine):
    model = TritonModel([slow_server.url("jet_tagger"), jet_tagger_server.url("jet_tagger")],
                        timeout_s=0.5, max_request_bytes=24 * 500)
    outputs = _run(model, chunks[:2])
    _assert_same(outputs, [engine(chunk)["probs"] for chunk in chunks[:2]])
    assert model.stats.retries >= 1 and model.stats.failovers >= 1
    assert "DEADLINE_EXCEEDED" in model._get_runtime().router.endpoints[0].last_error


def test_overloaded_server_gets_backoff_and_the_run_completes(busy_server, chunks, engine):
    model = TritonModel(busy_server.url("jet_tagger"), max_in_flight=8, max_request_bytes=24 * 100)
    outputs = _run(model, chunks[:1])
    _assert_same(outputs, [engine(chunks[0])["probs"]])
    stats = model.stats
    assert stats.requests == 15 and stats.retries >= 1 and stats.failed_requests >= 1
    assert model._get_runtime().window.limit < 8  # the client slowed down
    assert model._get_runtime().router.endpoints[0].healthy  # overload is not quarantine


def test_restarted_server_is_readmitted(chunks, jet_tagger_server):
    first, second = _jet_server(), jet_tagger_server
    port = first.ports["grpc"]
    model = TritonModel([first.url("jet_tagger"), second.url("jet_tagger")],
                        max_request_bytes=24 * 250, retry={"quarantine_s": 0.2,
                                                           "max_quarantine_s": 1.0})
    restarted = None
    try:
        _run(model, chunks[:2])
        first.stop()
        _run(model, chunks[2:4])  # served by the second server alone
        router = model._get_runtime().router
        assert not router.endpoints[0].healthy
        restarted = _jet_server(grpc_port=port)
        wait_for(lambda: router.endpoints[0].healthy, timeout=30, interval=0.1,
                 what=lambda: f"the restarted server to be readmitted: "
                              f"{router.describe('jet_tagger')}")
        _run(model, chunks[4:8])
        wait_for(lambda: _requests_served(restarted) > 0, timeout=10,
                 what="the restarted server's statistics to count its requests")
    finally:
        first.stop()
        if restarted is not None:
            restarted.stop()


# -- security -----------------------------------------------------------------------------------

def test_tls_server_is_served_over_grpcs_with_the_right_ca(certificates, engine, tls_server):
    url = tls_server.url("jet_tagger").replace("triton+grpc://", "triton+grpcs://")
    inputs = zoo.example_inputs("jet_tagger", 50)
    model = TritonModel(url, ssl={"root_certificates": certificates["ca"]})
    np.testing.assert_allclose(model(inputs)["probs"], engine(inputs)["probs"], atol=TOLERANCE)
    with pytest.MonkeyPatch.context() as patch:  # the CA from the settings, as on workers
        patch.setenv("COFFEA_SONIC_CA_FILE", certificates["ca"])
        assert TritonModel(url)(inputs)["probs"].shape == (50, 3)
    # pickles carry the CA's path, and a copy connects by itself
    assert pickle.loads(pickle.dumps(model))(inputs)["probs"].shape == (50, 3)
    untrusted = TritonModel(url, connect_timeout_s=2, fallback="off")
    with pytest.raises(ServerUnavailableError, match=tls_server.grpc_address):
        untrusted(inputs)
    plaintext = TritonModel(tls_server.url("jet_tagger"), connect_timeout_s=2, fallback="off")
    with pytest.raises(ServerUnavailableError):
        plaintext(inputs)


TOKEN_ENV = "COFFEA_SONIC_FAULTS_TEST_TOKEN"
TOKEN = "jwt-like-t0ken-that-must-never-be-printed"


def test_bearer_token_reaches_the_gateway_and_never_leaks(triton_server, monkeypatch, caplog):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    inputs = zoo.example_inputs("jet_tagger", 20)
    with TokenGateway(triton_server.grpc_address, token_env=TOKEN_ENV) as gateway:
        model = TritonModel(gateway.url("jet_tagger"),
                            headers={"authorization": Secret.bearer_from_env(TOKEN_ENV)})
        assert model(inputs)["probs"].shape == (20, 3)
        assert gateway.accepted > 0
        blob = pickle.dumps(model)
        assert TOKEN.encode() not in blob and TOKEN not in repr(model)
        # the token's variable NAME from the settings (what Dask workers get forwarded)
        monkeypatch.setenv("COFFEA_SONIC_TOKEN_ENV", TOKEN_ENV)
        from_settings = TritonModel(gateway.url("jet_tagger"))
        assert from_settings(inputs)["probs"].shape == (20, 3)
        assert TOKEN.encode() not in pickle.dumps(from_settings)
        monkeypatch.delenv("COFFEA_SONIC_TOKEN_ENV")
        wrong = TritonModel(gateway.url("jet_tagger"),
                            headers={"authorization": "Bearer wrong-" + TOKEN[::-1]})
        with caplog.at_level(logging.DEBUG, logger="coffea_sonic"):
            with pytest.raises(SonicError) as caught:
                wrong(inputs)
        text = str(caught.value) + " ".join(r.getMessage() for r in caplog.records)
        assert "UNAUTHENTICATED" in text
        assert TOKEN not in text and TOKEN[::-1] not in text
        assert wrong.stats.retries == 0  # an authentication failure is not retried


def test_fallback_to_a_local_server_or_a_custom_engine_when_no_server_answers(chunks, engine):
    from coffea_sonic import fallback as fallback_module

    dead = [f"triton+grpc://127.0.0.1:{free_port()}/jet_tagger" for _ in range(2)]
    expected = engine(chunks[0])["probs"]
    local = TritonModel(dead, fallback="local", connect_timeout_s=1)
    try:
        _assert_same([local(chunks[0])["probs"]], [expected])
        assert local.stats.fallback_rows == 1500
    finally:
        server_engine = fallback_module._engines.pop(("local", "jet_tagger"), None)
        if server_engine is not None:
            server_engine._fallback_server.stop()
    used = []

    def factory(name):
        used.append(name)
        return reference_engine(name, threads=1)

    custom = TritonModel(dead, fallback=factory, connect_timeout_s=1)
    _assert_same([custom(chunks[0])["probs"]], [expected])
    assert used == ["jet_tagger"] and custom.stats.fallback_calls == 1


def test_each_transport_case_sends_over_its_wire(jet_tagger_server, chunks, engine, each_transport):
    model = TritonModel(jet_tagger_server.url("jet_tagger"))
    outputs = assert_sent_over(each_transport, jet_tagger_server.grpc_address,
                               lambda: _run(model, chunks[:2]))
    _assert_same(outputs, [engine(chunk)["probs"] for chunk in chunks[:2]])
