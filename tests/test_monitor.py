"""``coffea-sonic monitor`` against the embedded Triton: figures equal the server's own statistics (read
through the transport layer, as monitor reads them from a triton+grpc:// URL),
and a real Prometheus (Debian's package) scrapes the server with deploy/prometheus.yml."""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from coffea_sonic.cli import main as cli_main
from coffea_sonic.core.endpoint import ServerSettings
from coffea_sonic.core.tensors import TensorInfo
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.facility.monitor import figures, metrics_url, monitor, render_frame, scrape
from coffea_sonic.server import free_port
from coffea_sonic.transport.base import InferRequest
from coffea_sonic.transport.grpc import GrpcTransport
from helpers import CheckedThread, wait_for

REPO = Path(__file__).resolve().parents[1]
MODEL = "jet_tagger"


def _client(server) -> GrpcTransport:
    """The gRPC transport the workers use; its ``statistics`` is the one statistics reader."""
    return GrpcTransport(ServerSettings(server.grpc_address))


def _infer(client: GrpcTransport, rows: int) -> None:
    features = np.random.default_rng(rows).normal(size=(rows, 6)).astype(np.float32)
    client.infer(InferRequest(MODEL, "", {"features": features},
                              (TensorInfo("probs", "FP32", (3,)),), rows=rows))


def _statistics(client: GrpcTransport) -> dict[str, float]:
    stats = client.statistics(MODEL, "", 10.0)
    return {"inferences": float(stats.inference_count),
            "executions": float(stats.execution_count),
            "requests": float(stats.success_count),
            "failures": float(stats.fail_count),
            "queue_us": stats.queue_ns / 1e3,
            "compute_us": stats.compute_infer_ns / 1e3}


def _consistent_pair(server, client):
    """A scrape and the statistics taken when both have seen the same requests."""
    def agreeing_pair():
        stats = _statistics(client)
        snapshot = scrape(server.metrics_url)
        if snapshot.models[(MODEL, "1")].successes == stats["requests"] == _statistics(client)["requests"]:
            return snapshot, stats
        return None

    return wait_for(agreeing_pair, timeout=30, interval=0.1,
                    what="metrics and statistics to agree on the request count")


def _assert_figures_match(figure, before: dict, after: dict) -> None:
    delta = {key: after[key] - before[key] for key in after}
    assert figure.inferences == delta["inferences"]
    assert figure.executions == delta["executions"]
    assert figure.requests == delta["requests"]
    assert figure.failures == delta["failures"] == 0
    assert figure.average_batch == pytest.approx(delta["inferences"] / delta["executions"])
    # metrics are whole microseconds per request, statistics nanoseconds: allow 1 us per request
    assert figure.queue_us_per_request == pytest.approx(delta["queue_us"] / delta["requests"], abs=1.0)
    assert figure.compute_us_per_request == pytest.approx(delta["compute_us"] / delta["requests"],
                                                          abs=1.0)
    assert figure.queue_us_per_execution == pytest.approx(
        delta["queue_us"] / delta["executions"], abs=1.0 * delta["requests"] / delta["executions"])


def test_frame_figures_match_server_statistics(triton_server):
    client = _client(triton_server)
    before_snapshot, before = _consistent_pair(triton_server, client)
    for rows in (1, 7, 64, 300, 1024, 5):
        _infer(client, rows)
    after_snapshot, after = _consistent_pair(triton_server, client)

    (figure,) = [f for f in figures(before_snapshot, after_snapshot) if f.model == MODEL]
    assert figure.inferences == 1 + 7 + 64 + 300 + 1024 + 5
    _assert_figures_match(figure, before, after)
    window = after_snapshot.taken_at - before_snapshot.taken_at
    assert figure.inferences_per_s == pytest.approx(figure.inferences / window)

    frame = render_frame([(before_snapshot, after_snapshot)])
    row = next(line for line in frame.splitlines() if line.strip().startswith(MODEL))
    assert f"{figure.average_batch:.1f}" in row.split()
    assert f"{figure.queue_us_per_request:.1f}" in row.split()
    assert "QUEUE us/EXEC" in frame and triton_server.metrics_url in frame

    # the first frame (no previous scrape) shows figures since the server started
    (cumulative,) = [f for f in figures(None, after_snapshot) if f.model == MODEL]
    zero = {key: 0.0 for key in after}
    _assert_figures_match(cumulative, zero, after)
    client.close()


def test_monitor_once_shows_live_numbers_while_requests_flow(triton_server):
    client = _client(triton_server)
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            _infer(client, 256)

    sender = CheckedThread(traffic)
    sender.start()
    out = io.StringIO()
    try:
        code = monitor([triton_server.metrics_url], interval_s=0.5, once=True, out=out)
    finally:
        stop.set()
        try:
            sender.finish(timeout=60)  # a failed request in the traffic thread fails the test
        finally:
            client.close()
    assert code == 0
    row = next(line for line in out.getvalue().splitlines() if line.strip().startswith(MODEL))
    inferences_per_s = row.split()[2]
    assert inferences_per_s not in ("0.0", "-"), out.getvalue()
    assert "(last 0.5 s)" in out.getvalue() or "(last 0." in out.getvalue()


def test_unreachable_endpoint_is_reported_and_exit_code_is_one():
    out = io.StringIO()
    url = f"http://127.0.0.1:{free_port()}/metrics"
    assert monitor([url], interval_s=0.01, once=True, out=out) == 1
    assert "cannot read" in out.getvalue() and "--metrics-port" in out.getvalue()


def test_grpc_address_is_refused_with_the_metrics_port_hint():
    with pytest.raises(ConfigurationError, match="metrics endpoint"):
        metrics_url("triton+grpc://127.0.0.1:8001/jet_tagger")


# -- Triton's statistics API instead of the metrics port ----------------------------------------
def test_statistics_api_gives_the_figures_the_metrics_give(triton_server):
    """``triton+grpc://`` reads the same counters through the transport: same figures."""
    client = _client(triton_server)
    statistics_url = f"triton+grpc://{triton_server.grpc_address}/{MODEL}"

    def agreeing_pair():
        from_api = scrape(statistics_url)
        from_metrics = scrape(triton_server.metrics_url)
        if (from_api.models[(MODEL, "1")].successes == from_metrics.models[(MODEL, "1")].successes
                == scrape(statistics_url).models[(MODEL, "1")].successes):
            return from_api, from_metrics
        return None

    api_before, metrics_before = wait_for(agreeing_pair, timeout=30, what="both sources to agree")
    answered_before = api_before.models[(MODEL, "1")].successes
    for rows in (3, 100, 2000):
        _infer(client, rows)

    def agreeing_after_all_three():
        # Triton counts a request just after answering it: both sources may agree on a count
        # that does not hold the last request yet
        pair = agreeing_pair()
        if pair and pair[0].models[(MODEL, "1")].successes >= answered_before + 3:
            return pair
        return None

    api_after, metrics_after = wait_for(agreeing_after_all_three, timeout=30,
                                        what="both sources to agree on the three requests")
    assert not api_after.error and api_after.url == f"triton+grpc://{triton_server.grpc_address}/{MODEL}"
    (api,) = figures(api_before, api_after)
    (metric,) = [f for f in figures(metrics_before, metrics_after) if f.model == MODEL]
    assert (api.inferences, api.requests, api.executions) == (2103, 3, metric.executions)
    assert (metric.inferences, metric.requests) == (2103, 3)
    # metrics are whole microseconds per request, statistics nanoseconds
    assert api.queue_us_per_request == pytest.approx(metric.queue_us_per_request, abs=1.0)
    assert api.compute_us_per_request == pytest.approx(metric.compute_us_per_request, abs=1.0)
    assert math.isnan(api.pending)
    every_model = scrape(f"triton+grpc://{triton_server.grpc_address}")
    assert {(MODEL, "1"), ("emtrk_cnn", "1")} <= set(every_model.models)
    client.close()


def test_monitor_reads_statistics_over_grpc_while_requests_flow(triton_server):
    client = _client(triton_server)
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            _infer(client, 256)

    sender = CheckedThread(traffic)
    sender.start()
    out = io.StringIO()
    try:
        code = monitor([f"triton+grpc://{triton_server.grpc_address}"], interval_s=0.5, once=True,
                       out=out)
    finally:
        stop.set()
        sender.finish(timeout=60)
    assert code == 0, out.getvalue()
    row = next(line for line in out.getvalue().splitlines() if line.strip().startswith(MODEL))
    assert row.split()[2] not in ("0.0", "-"), out.getvalue()


def test_statistics_of_a_restricted_server_say_what_to_do_instead(restricted_tritonserver,
                                                                  restriction):
    server, key = restricted_tritonserver, restriction
    snapshot = scrape(server.url(MODEL))
    every = scrape(f"triton+grpc://{server.grpc_address}")
    out = io.StringIO()
    assert monitor([server.url(MODEL)], interval_s=0.01, once=True, out=out) == 1
    assert "restricted" in snapshot.error and "metrics endpoint" in snapshot.error
    assert "cannot read the statistics" in snapshot.error
    assert "cannot read the repository index" in every.error and "name the model" in every.error
    assert key.value not in out.getvalue() and "restricted" in out.getvalue()


def test_cli_monitor_frames(triton_server, capsys):
    host_port = triton_server.metrics_url.split("//")[1].split("/")[0]
    assert cli_main(["monitor", host_port, "--frames", "2", "--interval-s", "0.2", "--no-color"]) == 0
    output = capsys.readouterr().out
    assert output.count("coffea-sonic monitor") == 2
    # the second frame covers the time since the first: 0.2 s asked, more on a loaded machine
    assert "since server start" in output and re.search(r"\(last \d+\.\d s\)", output), output


def test_cli_monitor_once_json_gives_the_figures_of_the_window(triton_server, capsys):
    host_port = triton_server.metrics_url.split("//")[1].split("/")[0]
    assert cli_main(["monitor", host_port, "--once", "--interval-s", "0.2", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    (server,) = record["servers"]
    assert server["error"] is None and server["window_s"] == pytest.approx(0.2, abs=0.15)
    assert {"jet_tagger"} <= {figure["model"] for figure in server["models"]}
    assert record["threshold_ms"] == 100.0 and record["scale_out"] is False
    assert cli_main(["monitor", host_port, "--json"]) == 2
    assert "--json needs --once" in capsys.readouterr().err


# -- real Prometheus ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prometheus_binary():
    binary = shutil.which("prometheus")
    if binary:
        return binary
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("Debian's prometheus package is not installed and this machine cannot install "
                    "it (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    installed = subprocess.run(
        ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-qq",
         "--no-install-recommends", "prometheus"], capture_output=True, text=True, env=env,
        timeout=600)
    if installed.returncode != 0:
        update = subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=300", "update", "-qq"],
                                capture_output=True, text=True, env=env, timeout=600)
        installed = subprocess.run(
            ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-qq",
             "--no-install-recommends", "prometheus"], capture_output=True, text=True, env=env,
            timeout=600)
        assert installed.returncode == 0, f"apt-get install prometheus failed:\n{update.stderr}\n{installed.stderr}"
    return shutil.which("prometheus")


def _query(base: str, expression: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def _start_prometheus(binary: str, config_path: Path, workdir: Path,
                      attempts: int = 5) -> tuple[subprocess.Popen, str, Path]:
    """Prometheus on a free loopback port: the process, its base URL and its log.

    The port is picked free and bound by Prometheus a moment later; another process on this
    shared machine may take it in between, so a start that fails with "address already in use"
    is retried on a new port.
    """
    for attempt in range(attempts):
        port = free_port()
        log_path = workdir / f"prometheus-{attempt}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [binary, f"--config.file={config_path}",
                 f"--storage.tsdb.path={workdir / f'data-{attempt}'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL, stderr=log)
        base = f"http://127.0.0.1:{port}"

        def ready_or_exited() -> str | None:
            if process.poll() is not None:
                return "exited"
            with urllib.request.urlopen(f"{base}/-/ready", timeout=1) as response:
                return "ready" if response.status == 200 else None

        state = wait_for(ready_or_exited, timeout=60, what="prometheus to become ready",
                         ignoring=(OSError,))
        if state == "ready":
            return process, base, log_path
        text = log_path.read_text(errors="replace")
        if "address already in use" not in text:
            raise AssertionError(f"prometheus exited during start-up:\n{text[-2000:]}")
    raise AssertionError(f"prometheus found its port taken {attempts} times in a row")


@pytest.fixture
def prometheus(prometheus_binary, triton_server, tmp_path):
    """Real Prometheus on loopback, scraping the embedded server every 0.5 s with our config."""
    config = yaml.safe_load((REPO / "deploy/prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "500ms"
    job = config["scrape_configs"][0]
    metrics_host = urllib.parse.urlsplit(triton_server.metrics_url).netloc
    job["static_configs"][0]["targets"] = [metrics_host]
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    process, base, log_path = _start_prometheus(prometheus_binary, config_path, tmp_path)
    try:
        # target discovery is throttled (about 5 s) before the first scrape
        try:
            wait_for(lambda: [r for r in _query(base, 'up{job="triton"}') if r["value"][1] == "1"],
                     timeout=60, what="prometheus to scrape the server", interval=0.1)
        except AssertionError as error:
            error.add_note(log_path.read_text(errors="replace")[-2000:])
            raise
        yield base
    finally:
        # killed, not stopped: a graceful stop writes out its database (here thrown away), which
        # took about 17 s on this machine
        process.kill()
        process.wait(timeout=30)


def test_real_prometheus_scrapes_server_and_computes_the_queue_metric(prometheus, triton_server):
    client = _client(triton_server)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        _infer(client, 512)
    # once it has scraped after the traffic, Prometheus's latest sample equals a direct scrape
    query = f'nv_inference_queue_duration_us{{model="{MODEL}"}}'

    def stored_equals_direct() -> list[dict] | None:
        direct = scrape(triton_server.metrics_url).models[(MODEL, "1")]
        stored = _query(prometheus, query)
        return stored if stored and float(stored[0]["value"][1]) == direct.queue_us else None

    stored = wait_for(stored_equals_direct, timeout=30, interval=0.2,
                      what="Prometheus's latest queue-time sample to equal a direct scrape")
    assert stored[0]["metric"]["release"] == "coffea-sonic"
    load = _query(prometheus,
                  'sum by (release) (increase(nv_inference_queue_duration_us[30s])) / '
                  'sum by (release) (increase(nv_inference_exec_count[30s]) * 1000 + 0.001)')
    assert load, "the SuperSONIC load query returned nothing"
    value = float(load[0]["value"][1])
    assert math.isfinite(value) and value > 0
    client.close()
