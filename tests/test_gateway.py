"""The facility's gateway: HAProxy from deploy/haproxy/gateway.cfg in front of a real tritonserver.

JWT bearer tokens are checked there (missing, expired, wrongly signed, for another audience: each
refused, and the client raises an AuthenticationError naming the gateway and where the token came
from, never the token); a per-subject quota answers RESOURCE_EXHAUSTED with ``retry-after``: the
client backs off at least that long and retries within its deadline, without quarantining the
gateway or falling back, and past the deadline raises an error naming the quota. The quota is per
user: a heavy user without any client-side gate is throttled while light users beside it are
never refused. Tokens an attacker would make (HS256 with the gateway's public key as the secret,
``alg: none``, no signature, a payload edited after signing) are refused like forged ones.

The gateway runs on loopback (the same configuration as across hosts, tests/test_multihost.py);
HAProxy is installed with apt where missing (root). The tests skip only where HAProxy cannot be
had at all (CommandUnavailableError); a gateway that does not start (HAProxy refusing
deploy/haproxy/gateway.cfg) fails them."""

from __future__ import annotations

import doctest
import logging
import re
import shutil
import tempfile
import time
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from coffea_sonic import TritonModel
from coffea_sonic.core.secrets import Secret
from coffea_sonic.errors import AuthenticationError, QuotaExceededError
from coffea_sonic.netlab import LocalHost
from coffea_sonic.netlab.gateway import GATEWAY_CONFIG, Gateway, start_gateway
from coffea_sonic.netlab.processes import CommandUnavailableError, ServiceStartError
from coffea_sonic.netlab.services import ensure_command
from coffea_sonic.netlab.tokens import TokenIssuer
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.server.launcher import free_port
import forged_tokens
from forged_tokens import sign_hs256, unsigned, with_claims, without_signature
from helpers import CheckedThread, run_in_threads, wait_for

#: inference requests per second per token subject, and the wait an over-quota answer asks for
QUOTA_RPS = 4
RETRY_AFTER_S = 0.3
ROWS = 64


class _Setup:
    def __init__(self, server: LocalTritonServer, gateway: Gateway, issuer: TokenIssuer,
                 folder: Path) -> None:
        self.server, self.gateway, self.issuer, self.folder = server, gateway, issuer, folder

    def token_file(self, subject: str | None, **options) -> Path:
        name = f"{subject}-{abs(hash(tuple(sorted(options.items()))))}.token"
        return self.issuer.write(self.folder / name, subject, **options)

    def raw_token_file(self, name: str, token: str) -> Path:
        path = self.folder / f"{name}.token"
        path.write_text(token)
        path.chmod(0o600)
        return path

    def model(self, token_file: Path | None, protocol: str = "grpc", **options) -> TritonModel:
        headers = ({"authorization": Secret.from_file(str(token_file), prefix="Bearer ")}
                   if token_file is not None else None)
        return TritonModel(self.gateway.url("jet_tagger", protocol), headers=headers,
                           transport=protocol, **options)


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> TokenIssuer:
    """The token issuer, and HAProxy installed: the two things these tests may lack here."""
    try:
        ensure_command("haproxy", "haproxy")
        return TokenIssuer(tmp_path_factory.mktemp("issuer"))
    except CommandUnavailableError as error:  # only what cannot be had skips, never a bad start
        pytest.skip(str(error))


def _start_gateway(here: LocalHost, server: LocalTritonServer, issuer: TokenIssuer, folder: Path,
                   config: Path = GATEWAY_CONFIG) -> Gateway:
    return start_gateway(
        here, [(server.grpc_address, server.ports["http"])], public_key=issuer.public_key,
        directory=folder / "gateway", quota_rps=QUOTA_RPS, retry_after_s=RETRY_AFTER_S,
        port=free_port(), stats_port=free_port(), http_port=free_port(), config=config)


@pytest.fixture(scope="module")
def setup(jet_tagger_server: LocalTritonServer, issuer: TokenIssuer) -> Iterator[_Setup]:
    folder = Path(tempfile.mkdtemp(prefix="gateway-test-"))
    with LocalHost(folder / "logs") as here:
        gateway = _start_gateway(here, jet_tagger_server, issuer, folder)
        yield _Setup(jet_tagger_server, gateway, issuer, folder)
    shutil.rmtree(folder, ignore_errors=True)


def test_a_gateway_whose_config_haproxy_refuses_fails_to_start_naming_haproxys_complaint(
        jet_tagger_server: LocalTritonServer, issuer: TokenIssuer, tmp_path: Path):
    broken = tmp_path / "haproxy"
    shutil.copytree(GATEWAY_CONFIG.parent, broken)  # grpc_refuse.lua must lie beside it
    config = broken / GATEWAY_CONFIG.name
    policy = config.read_text()
    assert "jwt_verify(" in policy
    config.write_text(policy.replace("jwt_verify(", "jwt_verify_misspelt(", 1))
    with LocalHost(tmp_path / "logs") as here:
        with pytest.raises(ServiceStartError) as raised:
            _start_gateway(here, jet_tagger_server, issuer, tmp_path, config=config)
        assert not any(process.alive for process in here.processes)
    # a failure of the thing under test, not the class the fixture skips on
    assert not isinstance(raised.value, CommandUnavailableError)
    message = str(raised.value)
    assert "exited" in message and "[ALERT]" in message and "jwt_verify_misspelt" in message
    assert str(config) in message


def _rows(seed: int, rows: int = ROWS) -> dict[str, np.ndarray]:
    return {"features": np.random.default_rng(seed).normal(size=(rows, 6)).astype(np.float32)}


def _direct(setup: _Setup, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return TritonModel(setup.server.url("jet_tagger"), transport="grpc")(inputs)["probs"]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_valid_token_is_served_through_the_gateway(setup: _Setup, protocol: str):
    inputs = _rows(1)
    model = setup.model(setup.token_file("alice"), protocol)
    answer = model(inputs)["probs"]
    np.testing.assert_array_equal(answer, _direct(setup, inputs))
    assert model.transport_kind == protocol


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("problem, options, reason", [
    ("missing", None, "no bearer token"),
    ("expired", {"ttl_s": -60}, "token expired"),
    ("wrong signature", "other issuer", "signature does not verify"),
    ("wrong audience", {"audience": "another-service"}, "audience is not coffea-sonic"),
])
def test_a_refused_token_raises_an_authentication_error_naming_the_gateway_and_its_source(
        setup: _Setup, problem: str, options, reason: str, protocol: str):
    if options is None:
        token_file = None
    elif options == "other issuer":
        token_file = TokenIssuer(setup.folder / "other-issuer").write(
            setup.folder / "forged.token", "mallory")
    else:
        token_file = setup.token_file("bob", **options)
    _assert_refused(setup, token_file, protocol, reason)


def _assert_refused(setup: _Setup, token_file: Path | None, protocol: str, reason: str) -> None:
    with pytest.raises(AuthenticationError) as raised:
        setup.model(token_file, protocol)(_rows(2))
    message = str(raised.value)
    address = setup.gateway.http_address if protocol == "http" else setup.gateway.address
    assert address in message and reason in message
    if token_file is None:
        assert "no token" in message
    else:
        assert f"file:{token_file}" in message
        token = token_file.read_text()
        for part in filter(None, token.split(".")):
            assert part not in message, "the token leaked into the error"


#: tokens an attacker can make with the gateway's public key and a token of their own, and the
#: check of deploy/haproxy/gateway.cfg that must refuse each
ATTACKS = {
    "HS256 keyed with the public key's PEM": (
        lambda issuer: sign_hs256(issuer.claims_for("mallory"), issuer.public_key.read_bytes()),
        "not an RS256 JWT"),
    # HAProxy's jwt_verify takes an HMAC algorithm's key argument as the secret itself: with the
    # algorithm left to the token, the configured key's path would be the secret
    "HS256 keyed with the public key's path": (
        lambda issuer: sign_hs256(issuer.claims_for("mallory"), str(issuer.public_key)),
        "not an RS256 JWT"),
    "alg none with an empty signature": (
        lambda issuer: unsigned(issuer.claims_for("mallory")), "not an RS256 JWT"),
    "alg RS256 with an empty signature": (
        lambda issuer: unsigned(issuer.claims_for("mallory"), alg="RS256"),
        "signature does not verify"),
    "no signature part": (
        lambda issuer: without_signature(issuer.issue("mallory")), "signature does not verify"),
    "subject edited after signing": (
        lambda issuer: with_claims(issuer.issue("mallory"), sub="alice"),
        "signature does not verify"),
    "an expired token's exp edited after signing": (
        lambda issuer: with_claims(issuer.issue("mallory", ttl_s=-60),
                                   exp=int(time.time()) + 3600),
        "signature does not verify"),
}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_token_an_attacker_made_is_refused_with_an_authentication_error(
        setup: _Setup, attack: str, protocol: str):
    make, reason = ATTACKS[attack]
    token_file = setup.raw_token_file(re.sub(r"\W+", "-", attack), make(setup.issuer))
    _assert_refused(setup, token_file, protocol, reason)


#: calls of each light user: fewer than the quota allows a subject in one second
LIGHT_CALLS = QUOTA_RPS - 1


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_quota_is_per_user_a_heavy_user_is_throttled_and_light_users_are_never_refused(
        setup: _Setup, caplog: pytest.LogCaptureFixture, protocol: str):
    heavy = setup.model(setup.token_file(f"heavy-{protocol}"), protocol, max_in_flight=8,
                        max_request_bytes=ROWS * 24, retry={"total_s": 60.0})
    lights = [setup.model(setup.token_file(f"light{index}-{protocol}"), protocol,
                          retry={"total_s": 60.0}) for index in range(3)]
    heavy_inputs = _rows(3, rows=ROWS * 16)  # 16 requests at once, 4/s allowed
    stop = threading.Event()

    def heavy_user() -> int:
        calls = 0
        while not stop.is_set() or calls == 0:
            answer = heavy(heavy_inputs)["probs"]
            assert answer.shape == (ROWS * 16, 3)
            calls += 1
        return calls

    def light_user(index: int) -> list[np.ndarray]:
        return [lights[index](_rows(10 + index))["probs"] for _ in range(LIGHT_CALLS)]

    caplog.set_level(logging.INFO, logger="coffea_sonic")
    heavy_thread = CheckedThread(heavy_user, name="heavy user")
    heavy_thread.start()
    try:
        # the light users start once the heavy one is over its quota, and it stays over it (each
        # of its calls is 4 s of quota) until they are done
        wait_for(lambda: heavy.stats.failed_requests > 0 or not heavy_thread.is_alive(), 120,
                 "the gateway to refuse the heavy user over its quota")
        assert heavy_thread.is_alive(), "the heavy user stopped before it was throttled"
        light_answers = run_in_threads(light_user, [(index,) for index in range(3)], timeout=120)
    finally:
        stop.set()
        heavy_calls = heavy_thread.finish(timeout=120)
    assert heavy_calls >= 1
    for index, answers in enumerate(light_answers):
        expected = _direct(setup, _rows(10 + index))
        for answer in answers:
            np.testing.assert_array_equal(answer, expected)
    # per user: no light user's request was refused (a refusal is counted failed and retried),
    # while the heavy one's were, over its quota, and came back later
    for index, light in enumerate(lights):
        assert (light.stats.requests, light.stats.failed_requests, light.stats.retries) == (
            LIGHT_CALLS, 0, 0), f"light user {index} was refused: {light.stats}"
    assert heavy.stats.failed_requests > 0 and heavy.stats.retries > 0
    # refusals are not failures of the gateway (never quarantined) and nothing ran in a fallback
    assert heavy.stats.fallback_rows == 0
    assert "quarantined" not in caplog.text
    waits = [float(wait) for wait in re.findall(
        r"retrying jet_tagger rows \d+-\d+ in ([0-9.]+) s .*quota exceeded", caplog.text)]
    assert waits and min(waits) >= RETRY_AFTER_S - 1e-3, "the retry-after was not honoured"
    assert len(waits) <= heavy.stats.retries, "quota refusals someone other than the heavy user got"


def test_past_the_deadline_the_quota_refusal_raises_an_error_naming_the_quota(setup: _Setup):
    model = setup.model(setup.token_file("hasty"), max_in_flight=8, max_request_bytes=ROWS * 24,
                        retry={"total_s": 1.0}, fallback="cpu")
    with pytest.raises(QuotaExceededError, match=rf"quota exceeded: {QUOTA_RPS} inference "
                                                 r"requests/s per token subject"):
        for _ in range(5):  # 5 x 16 requests within 1 s each, 4/s allowed
            model(_rows(4, rows=ROWS * 16))
    assert model.stats.fallback_rows == 0


def test_shared_memory_and_model_control_calls_are_refused_and_auto_sends_over_grpc(
        setup: _Setup):
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    token = setup.token_file("carol")
    metadata = (("authorization", f"Bearer {token.read_text()}"),)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(setup.gateway.address))
    calls = [("SystemSharedMemoryRegister", service_pb2.SystemSharedMemoryRegisterRequest(
                 name="probe", key="/probe", offset=0, byte_size=64)),
             ("RepositoryModelUnload", service_pb2.RepositoryModelUnloadRequest(
                 model_name="jet_tagger"))]
    for method, request in calls:
        with pytest.raises(grpc.RpcError) as refused:
            getattr(stub, method)(request, metadata=metadata, timeout=10)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, method
    # the gateway is on this host, but it is not the server: auto finds out and uses gRPC
    model = TritonModel(setup.gateway.url("jet_tagger"), transport="auto",
                        headers={"authorization": Secret.from_file(str(token), prefix="Bearer ")})
    inputs = _rows(5)
    np.testing.assert_array_equal(model(inputs)["probs"], _direct(setup, inputs))
    assert model.transport_kind == "grpc"
    # and the model is still loaded for everyone
    np.testing.assert_array_equal(_direct(setup, inputs), model(inputs)["probs"])


def test_over_http_a_user_over_quota_gets_429_backs_off_and_completes(
        setup: _Setup, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="coffea_sonic")
    model = setup.model(setup.token_file("dave"), "http", max_in_flight=8,
                        max_request_bytes=ROWS * 24, retry={"total_s": 60.0})
    inputs = _rows(6, rows=ROWS * 16)  # 16 requests at once, 4/s allowed
    np.testing.assert_array_equal(model(inputs)["probs"], _direct(setup, inputs))
    assert model.stats.failed_requests > 0 and model.stats.fallback_rows == 0
    assert "quarantined" not in caplog.text
    waits = [float(wait) for wait in re.findall(
        r"retrying jet_tagger rows \d+-\d+ in ([0-9.]+) s .*HTTP 429.*quota exceeded", caplog.text)]
    assert waits and min(waits) >= RETRY_AFTER_S - 1e-3, "the Retry-After was not honoured"
    hasty = setup.model(setup.token_file("erin"), "http", max_in_flight=8,
                        max_request_bytes=ROWS * 24, retry={"total_s": 1.0})
    with pytest.raises(QuotaExceededError, match="quota exceeded"):
        for _ in range(5):
            hasty(inputs)


def test_over_http_shared_memory_and_model_control_are_refused_and_nothing_passes_without_a_token(
        setup: _Setup):
    import urllib.error
    import urllib.request

    def status(path: str, token: Path | None, body: bytes | None = b"{}") -> int:
        request = urllib.request.Request(f"http://{setup.gateway.http_address}{path}", data=body)
        if token is not None:
            request.add_header("authorization", f"Bearer {token.read_text()}")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as refused:
            return refused.code

    token = setup.token_file("frank")
    assert status("/v2/health/ready", token, body=None) == 200
    assert status("/v2/health/ready", None, body=None) == 401
    assert status("/v2/models/jet_tagger/infer", None) == 401
    assert status("/v2/systemsharedmemory/region/probe/register", token) == 403
    assert status("/v2/repository/models/jet_tagger/unload", token) == 403
    # the model is still loaded for everyone
    inputs = _rows(7)
    np.testing.assert_array_equal(setup.model(token, "http")(inputs)["probs"],
                                  _direct(setup, inputs))


def test_forged_tokens_carry_the_claims_the_attacker_wrote():
    """The forging helpers' own examples: what the gateway is shown is what the attacker meant."""
    failed, attempted = doctest.testmod(forged_tokens)
    assert attempted and not failed
