"""``coffea-sonic check`` against real servers: the embedded Triton (plain and TLS), a token gateway,
and the deployments of issue 10: a tritonserver restricting protocol groups, PyTriton at its
defaults, two servers behind HAProxy.

Each case gets a clear verdict and advice: all good; server down; wrong port; model missing; TLS
required but not configured; token rejected (and missing); restricted groups; why shared memory is
not used. On every deployment, what check says about the transport is what a default TritonModel
does there.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from coffea_sonic import TritonModel, zoo
from coffea_sonic.cli import main as cli_main
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.facility.check import (CheckOptions, check_on_workers, check_server,
                                         check_servers, configured_targets, parse_target,
                                         render_reports)
from coffea_sonic.facility.cluster import make_cluster
from coffea_sonic.facility.gateway import TokenGateway
from coffea_sonic.server import free_port
from helpers import CheckedThread, wait_for
from interop_servers import HAProxy, PyTritonJetTagger, RESTRICTED_GROUPS

TOKEN_ENV = "COFFEA_SONIC_CHECK_TEST_TOKEN"
TOKEN = "t0ken-value-that-must-never-be-printed"


@pytest.fixture(scope="module")
def gateway(triton_server):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TOKEN_ENV, TOKEN)
        with TokenGateway(triton_server.grpc_address, token_env=TOKEN_ENV) as running:
            yield running


def _statuses(report) -> dict[str, str]:
    return {finding.aspect: finding.status for finding in report.findings}


def test_all_good_reports_server_models_versions_and_latency(triton_server):
    report = check_server(triton_server.url("jet_tagger"), pings=3)
    assert report.ok, render_reports([report])
    assert _statuses(report) == {aspect: "ok" for aspect in
                                 ("reachable", "protocol", "tls", "auth", "server", "access",
                                  "model", "latency", "transport")}
    assert report.server_version.startswith("triton ")
    served = {(model.name, model.version, model.state) for model in report.models}
    assert {("jet_tagger", "1", "READY"), ("particlenet_lite", "1", "READY"),
            ("emtrk_cnn", "1", "READY")} <= served
    assert len(report.health_ms) == 3 and len(report.inference_ms) == 3
    assert all(0 < ms < 5000 for ms in report.health_ms + report.inference_ms)
    text = render_reports([report])
    assert "features FP32[6] -> probs[3]" in text and "all good" in text
    assert report.restricted == [] and "open to this client" in report.finding("access").summary


def test_server_down_says_nothing_listens_and_how_to_fix():
    port = free_port()
    report = check_server(f"127.0.0.1:{port}")
    assert not report.ok
    finding = report.finding("reachable")
    assert finding.status == "fail" and "connection refused" in finding.summary
    assert "server is down" in finding.advice and "8001" in finding.advice
    assert len(report.findings) == 1  # nothing after an unreachable server


def test_unresolvable_host_is_reported_as_dns_problem():
    finding = check_server("no-such-host.invalid:8001").finding("reachable")
    assert finding.status == "fail" and "does not resolve" in finding.summary


@pytest.mark.parametrize("port_kind, expected", [("http", "HTTP/REST port"),
                                                 ("metrics", "Prometheus metrics port")])
def test_wrong_port_names_which_triton_port_it_is(triton_server, port_kind, expected):
    port = triton_server.ports[port_kind]
    report = check_server(f"triton+grpc://127.0.0.1:{port}/jet_tagger")
    finding = report.finding("protocol")
    assert finding.status == "fail" and expected in finding.summary, render_reports([report])
    assert "gRPC port" in finding.advice


def test_non_triton_listener_is_not_grpc():
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.1)  # so the answering thread sees ``done`` and can be joined
    done = threading.Event()

    def answer_garbage() -> None:
        while not done.is_set():  # every probe gets an SSH banner until the check is over
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                try:
                    connection.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the probe hung up first: its business, not a failure of this fake

    answering = CheckedThread(answer_garbage)
    answering.start()
    try:
        report = check_server(f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=2)
    finally:
        done.set()
        answering.finish(timeout=10)
        listener.close()
    finding = report.finding("protocol")
    assert finding.status == "fail" and "does not speak gRPC" in finding.summary


def test_model_missing_lists_what_the_server_has(triton_server):
    report = check_server(triton_server.url("no_such_model"))
    finding = report.finding("model")
    assert finding.status == "fail"
    assert "'no_such_model' is not in the server's repository" in finding.summary
    assert "jet_tagger" in finding.summary and "model name" in finding.advice
    assert report.finding("server").status == "ok"


def test_missing_model_version_is_not_ready(triton_server):
    finding = check_server(triton_server.url("jet_tagger", 7)).finding("model")
    assert finding.status == "fail" and "version 7 is not ready" in finding.summary
    assert "v1 READY" in finding.summary


def test_tls_required_but_not_configured(tls_server):
    report = check_server(f"triton+grpc://{tls_server.grpc_address}/jet_tagger")
    assert report.finding("protocol").summary.startswith("TLS")
    finding = report.finding("tls")
    assert finding.status == "fail" and "requires TLS" in finding.summary
    assert "triton+grpcs://" in finding.advice and "--ca-file" in finding.advice


def test_tls_with_untrusted_certificate_asks_for_the_ca(tls_server):
    finding = check_server(f"triton+grpcs://{tls_server.grpc_address}/jet_tagger").finding("tls")
    assert finding.status == "fail" and "not trusted" in finding.summary
    assert "--ca-file" in finding.advice


def test_tls_with_the_right_ca_is_all_good(tls_server, certificates):
    report = check_server(f"triton+grpcs://{tls_server.grpc_address}/jet_tagger",
                          ca_file=certificates["ca"], pings=2)
    assert report.ok, render_reports([report])
    assert "verified" in report.finding("tls").summary
    assert report.finding("model").status == "ok"


def test_tls_requested_from_plaintext_server(triton_server):
    finding = check_server(f"triton+grpcs://{triton_server.grpc_address}/jet_tagger").finding("tls")
    assert finding.status == "fail" and "plaintext" in finding.summary


def test_token_missing_is_reported_with_how_to_pass_one(gateway):
    report = check_server(gateway.url("jet_tagger"))
    finding = report.finding("auth")
    assert finding.status == "fail" and "requires a token" in finding.summary
    assert "--token-env" in finding.advice


def test_token_rejected_is_reported_without_revealing_it(gateway, monkeypatch):
    monkeypatch.setenv("WRONG_TOKEN", "not-the-right-one")
    report = check_server(gateway.url("jet_tagger"), token_env="WRONG_TOKEN")
    finding = report.finding("auth")
    assert finding.status == "fail" and "$WRONG_TOKEN was rejected" in finding.summary
    assert "UNAUTHENTICATED" in finding.summary and "fresh one" in finding.advice
    assert "not-the-right-one" not in render_reports([report])


def test_token_accepted_through_gateway(gateway):
    rejected_before = gateway.rejected
    report = check_server(gateway.url("jet_tagger"), token_env=TOKEN_ENV, pings=2)
    assert report.ok, render_reports([report])
    assert report.finding("auth").summary == f"token from ${TOKEN_ENV} accepted"
    assert gateway.rejected == rejected_before
    assert TOKEN not in render_reports([report])


def test_cli_exit_codes_and_report_text(triton_server, gateway, capsys):
    assert cli_main(["check", triton_server.url("jet_tagger"), "--pings", "1"]) == 0
    good = capsys.readouterr().out
    assert "all good" in good and "1 of 1 server(s) OK" in good
    assert cli_main(["check", gateway.url("jet_tagger"), "--token-env", TOKEN_ENV]) == 0
    assert TOKEN not in capsys.readouterr().out
    down = f"127.0.0.1:{free_port()}"
    assert cli_main(["check", triton_server.url("jet_tagger"), down]) == 1
    mixed = capsys.readouterr().out
    assert "1 of 2 server(s) OK" in mixed and "what to do:" in mixed
    assert cli_main(["check", "http://127.0.0.1:8000"]) == 2
    assert "triton+http://host:port/model" in capsys.readouterr().err


def test_cli_json_report_has_every_finding_and_the_same_exit_code(triton_server, capsys):
    down = f"127.0.0.1:{free_port()}"
    assert cli_main(["check", triton_server.url("jet_tagger"), down, "--pings", "1", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    good, bad = document["servers"]
    assert document["ok"] is False and good["ok"] is True and bad["ok"] is False
    assert {f["aspect"] for f in good["findings"]} >= {"reachable", "server", "model", "latency"}
    assert any(m["name"] == "jet_tagger" and m["state"] == "READY" for m in good["models"])
    assert len(good["inference_ms"]) == 1 and good["transport"] in ("shm", "grpc", "http")
    assert any(f["status"] == "fail" and f["advice"] for f in bad["findings"])


def test_cli_entry_point_runs_as_a_program(triton_server):
    result = subprocess.run([sys.executable, "-m", "coffea_sonic.cli", "check",
                             triton_server.url("no_such_model")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert "no_such_model" in result.stdout and "[FAIL] model" in result.stdout


def test_without_urls_checks_the_configured_servers(triton_server, monkeypatch, tmp_path):
    for name in ("COFFEA_SONIC_CONFIG", "COFFEA_SONIC_SERVERS"):
        monkeypatch.delenv(name, raising=False)
    facility_file = tmp_path / "endpoints.toml"
    facility_file.write_text(f'[models]\nparticlenet_lite = ["{triton_server.url("particlenet_lite")}"]\n')
    monkeypatch.setenv("COFFEA_SONIC_CONFIG", str(facility_file))
    monkeypatch.setenv("COFFEA_SONIC_MODEL_JET_TAGGER", triton_server.url("jet_tagger"))
    expected = [triton_server.url("jet_tagger"), triton_server.url("particlenet_lite")]
    assert configured_targets() == expected
    reports = check_servers(pings=1)
    assert [report.target for report in reports] == expected
    assert all(report.ok for report in reports)


def test_check_runs_on_dask_workers_with_token_forwarded_by_name(gateway, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with make_cluster("local", workers=1, env=[TOKEN_ENV], include_settings=False) as cluster:
        by_worker = check_on_workers(cluster.client, [gateway.url("jet_tagger")],
                                     CheckOptions(token_env=TOKEN_ENV, pings=1))
    (reports,) = by_worker.values()
    assert reports[0].ok and reports[0].where, render_reports(reports)


def test_parse_target_forms():
    assert parse_target("triton+grpc://h:9001/m/3") == parse_target("grpc://h:9001/m/3")
    assert parse_target("h").port == 8001
    assert parse_target("[::1]:8001").host == "::1"
    assert parse_target("[::1]:8001").address == "[::1]:8001"
    assert parse_target("triton+http://h/m").port == 8000  # the client's URL parser, its defaults
    assert parse_target("triton+grpcs://h:443").tls is True
    for wrong in ("triton+grpc://h/m/latest", "triton+grpc://user:pw@h/m", "h:notaport"):
        with pytest.raises(ConfigurationError):
            parse_target(wrong)


def test_cli_check_on_workers_reports_from_the_worker(gateway, monkeypatch, capsys):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    code = cli_main(["check", gateway.url("jet_tagger"), "--token-env", TOKEN_ENV,
                     "--on-workers", "local", "--pings", "1"])
    output = capsys.readouterr().out
    assert code == 0, output
    assert "(from " in output and "all good" in output and TOKEN not in output


# -- the deployments of issue 10 ---------------------------------------------------------------
PROTOCOL_KEY_ENV = "COFFEA_SONIC_CHECK_TEST_PROTOCOL_KEY"


def _what_a_default_model_does(url: str) -> tuple[str, int]:
    """The transport a default TritonModel (transport='auto', no key) uses for ``url``, and the rows
    one call of it returns: what check must agree with."""
    model = TritonModel(url, fallback="off")
    try:
        outputs = model(zoo.example_inputs("jet_tagger", 257, seed=3))
        assert model.stats.fallback_rows == 0
        return model.transport_kind, len(outputs["probs"])
    finally:
        model.close()


def _assert_agrees_with_the_client(report, url: str) -> None:
    transport, rows = _what_a_default_model_does(url)
    assert rows == 257
    assert report.transport == transport, render_reports([report])


def test_direct_server_uses_shared_memory_like_the_workers(triton_server):
    url = triton_server.url("jet_tagger")
    report = check_server(url, pings=2)
    assert report.ok, render_reports([report])
    assert (report.transport, report.shm_usable, report.shm_cause) == ("shm", True, "usable")
    finding = report.finding("transport")
    assert finding.status == "ok" and "system shared memory" in finding.summary
    assert "status calls all reached the server" in report.shm_reason
    _assert_agrees_with_the_client(report, url)


def test_http_url_is_checked_over_the_http_transport(triton_server):
    report = check_server(f"triton+http://{triton_server.http_address}/jet_tagger", pings=1)
    assert report.ok, render_reports([report])
    assert report.finding("protocol").summary.startswith("HTTP/1.1")
    assert (report.transport, report.shm_cause) == ("http", "http")
    assert len(report.inference_ms) == 1


def test_restricted_server_lists_groups_infers_and_sends_over_grpc(restricted_tritonserver,
                                                                   restriction):
    url = restricted_tritonserver.url("jet_tagger")
    report = check_server(url, pings=2)
    text = render_reports([report])
    assert report.ok, text
    assert report.restricted == sorted(RESTRICTED_GROUPS)
    access = report.finding("access")
    assert access.status == "warn" and "triton-grpc-protocol-k" in access.summary
    assert "--protocol-key-name k" in access.advice
    model = report.finding("model")
    assert model.status == "ok" and "(from its metadata)" in model.summary, text
    assert len(report.inference_ms) == 2 and report.finding("latency").status == "ok"
    assert (report.transport, report.shm_usable, report.shm_cause) == ("grpc", False, "restricted")
    assert "restricts its shared-memory protocol" in report.finding("transport").summary
    assert "usable (see [warn] above)" in text and restriction.value not in text
    _assert_agrees_with_the_client(report, url)


def test_restricted_server_with_its_key_is_open_and_uses_shared_memory(
        restricted_tritonserver, restriction, monkeypatch, capsys):
    monkeypatch.setenv(PROTOCOL_KEY_ENV, restriction.value)
    url = restricted_tritonserver.url("jet_tagger")
    report = check_server(url, pings=1, protocol_key_name=restriction.key,
                          protocol_key_env=PROTOCOL_KEY_ENV)
    assert report.ok and report.restricted == [], render_reports([report])
    assert "with protocol key 'k'" in report.finding("access").summary
    assert report.transport == "shm"
    assert cli_main(["check", url, "--pings", "1", "--protocol-key-name", restriction.key,
                     "--protocol-key-env", PROTOCOL_KEY_ENV]) == 0
    output = capsys.readouterr().out
    assert "all good" in output and restriction.value not in output
    monkeypatch.setenv(PROTOCOL_KEY_ENV, "a-wrong-key")
    wrong = check_server(url, pings=1, protocol_key_name=restriction.key,
                         protocol_key_env=PROTOCOL_KEY_ENV)
    assert wrong.restricted == sorted(RESTRICTED_GROUPS) and wrong.transport == "grpc"
    assert "configured protocol key was not accepted" in wrong.finding("access").advice


def test_restricted_server_over_http(restricted_tritonserver):
    report = check_server(f"triton+http://{restricted_tritonserver.http_address}/jet_tagger",
                          pings=1)
    assert report.ok, render_reports([report])
    assert report.restricted == ["model-repository", "statistics"]  # shared memory: gRPC only
    assert report.transport == "http" and len(report.inference_ms) == 1


@pytest.fixture(scope="module")
def pytriton_server(tmp_path_factory):
    """PyTriton 0.7 at its defaults (access token on), jet_tagger bound to onnxruntime."""
    with PyTritonJetTagger(tmp_path_factory.mktemp("pytriton")) as server:
        yield server


def test_pytriton_defaults_are_reported_and_agree_with_the_client(pytriton_server):
    report = check_server(pytriton_server.url(), pings=2)
    text = render_reports([report])
    assert report.ok, text
    assert set(RESTRICTED_GROUPS) <= set(report.restricted), text
    assert "triton-access-token" in report.finding("access").advice
    assert "inputs features FP32[6] -> probs[3]" in report.finding("model").summary
    assert len(report.inference_ms) == 2
    assert (report.transport, report.shm_cause) == ("grpc", "restricted")
    _assert_agrees_with_the_client(report, pytriton_server.url())


@pytest.fixture
def haproxy(triton_server, jet_tagger_server):
    """Debian's haproxy, round robin per gRPC call, over two embedded servers on this host."""
    with HAProxy([triton_server.grpc_address, jet_tagger_server.grpc_address]) as running:
        yield running


def test_servers_behind_haproxy_are_reported_and_agree_with_the_client(haproxy):
    report = check_server(haproxy.url(), pings=2)
    text = render_reports([report])
    assert report.ok, text
    assert report.restricted == []
    assert (report.transport, report.shm_usable, report.shm_cause) == ("grpc", False, "proxy")
    assert "proxy or load balancer" in report.finding("transport").summary
    assert len(report.inference_ms) == 2
    _assert_agrees_with_the_client(report, haproxy.url())


def test_one_row_inference_is_the_workers_call(triton_server):
    """The tiny inference goes through TritonModel: the server counts it for the model named."""
    model = TritonModel(triton_server.url("particlenet_lite"))
    before = model.server_statistics().success_count
    report = check_server(triton_server.url("particlenet_lite"), pings=3)
    assert report.ok, render_reports([report])
    wait_for(lambda: model.server_statistics().success_count - before == 3, timeout=30,
             what="the server to count check's three one-row requests")
    assert np.median(report.inference_ms) > 0


def test_the_workers_transport_setting_is_what_check_reports(triton_server, monkeypatch):
    monkeypatch.setenv("COFFEA_SONIC_TRANSPORT", "grpc")
    url = triton_server.url("jet_tagger")
    report = check_server(url, pings=1)
    assert report.ok, render_reports([report])
    assert (report.transport, report.shm_cause) == ("grpc", "not-asked")
    _assert_agrees_with_the_client(report, url)
