"""The analysis across hosts: Dask workers on two worker hosts, two tritonservers on two server hosts
behind the HAProxy gateway (JWT tokens), each host a network namespace with its own /dev/shm and a
1 Gb/s link (coffea_sonic.netlab.Facility). The demo runs there; the example analysis gives the
single-host run's histograms, also while a fault strikes mid-run: a server host's link cut and
restored, the gateway killed and restarted, a worker host cut off, a link degraded to 10 %.

A fault is struck by a watcher thread as soon as the servers' own statistics show that the run is
inferring (a condition, not a delay), and undone on a condition too. Dask's task retries are off:
a chunk the client failed would fail the run instead of being redone. Needs root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from coffea_sonic.data.synthetic import write_sample
from coffea_sonic.demo import DEMO_MODELS
from coffea_sonic.examples.jet_tagging import JetTaggingProcessor
from coffea_sonic.netlab import Link, missing_requirements, port_open
from coffea_sonic.netlab.facility import Facility
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.stats import InferenceStats, settled
from helpers import CheckedThread, assert_same_histograms, wait_for

pytestmark = [pytest.mark.netlab, pytest.mark.slow,
              pytest.mark.skipif(bool(missing_requirements()), reason=missing_requirements())]

#: events per dataset (two datasets, two files each) and per chunk: enough chunks that a fault
#: struck at the first served rows lands mid-run
EVENTS_PER_DATASET = 1000
CHUNKSIZE = 200
#: how long the analysis may take, faults included (a loaded 2-core machine)
RUN_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    return write_sample(tmp_path_factory.mktemp("multihost-sample"), events=EVENTS_PER_DATASET,
                        files=2, seed=19)


@pytest.fixture(scope="module")
def single_host(sample: dict[str, list[str]]) -> dict[str, Any]:
    """The example analysis on one host: an embedded server, coffea's iterative executor."""
    with LocalTritonServer(models=list(DEMO_MODELS), device="cpu") as server:
        analysis = JetTaggingProcessor(f"triton+grpc://{server.grpc_address}", physics=True)
        return _runner(processor.IterativeExecutor(status=False))(
            _runnable(sample), treename="Events", processor_instance=analysis)


@pytest.fixture(scope="module")
def facility(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Facility]:
    logs = tmp_path_factory.mktemp("multihost-logs")  # kept by pytest: what failed, and why
    with Facility(models=list(DEMO_MODELS), logs=logs) as running:
        previous = os.environ.get("COFFEA_SONIC_TOKEN_FILE")
        os.environ["COFFEA_SONIC_TOKEN_FILE"] = str(running.token_file)
        try:
            yield running
        finally:
            if previous is None:
                os.environ.pop("COFFEA_SONIC_TOKEN_FILE", None)
            else:
                os.environ["COFFEA_SONIC_TOKEN_FILE"] = previous


@pytest.fixture(scope="module")
def dask_client(facility: Facility) -> Iterator[Any]:
    from distributed import Client

    with Client(facility.scheduler, timeout=60) as client:
        client.wait_for_workers(2, timeout=120)
        yield client


def _runnable(sample: dict[str, list[str]]) -> dict[str, Any]:
    return {name: {"files": {path: "Events" for path in files}} for name, files in sample.items()}


def _runner(executor: Any) -> processor.Runner:
    # NanoAODSchema itself: a schema class defined here would reach the workers as a reference
    # to this test module, which they cannot import
    return processor.Runner(executor=executor, schema=NanoAODSchema, chunksize=CHUNKSIZE)


def _run_across(facility: Facility, client: Any, sample: dict[str, list[str]]) -> dict[str, Any]:
    """The example analysis on the worker hosts, served behind the gateway (no task retries)."""
    analysis = JetTaggingProcessor(f"triton+grpc://{facility.gateway.address}", physics=True)
    executor = processor.DaskExecutor(client=client, status=False, retries=0)
    return _runner(executor)(_runnable(sample), treename="Events", processor_instance=analysis)


def _served_rows(facility: Facility) -> int:
    """Rows the servers have answered (their HTTP statistics, read from the submitting host); a
    server out of reach (its link cut) counts 0."""
    total = 0
    for triton in facility.tritons:
        for name in DEMO_MODELS:
            url = f"http://{triton.http_address}/v2/models/{name}/stats"
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    statistics = json.load(response)
            except OSError:
                break
            total += sum(int(entry.get("inference_count", 0)) for entry in statistics["model_stats"])
    return total


def _total(stats: dict[str, InferenceStats]) -> InferenceStats:
    total = InferenceStats()
    for value in stats.values():
        total = total + value
    return total


def _assert_nothing_lost(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["cutflow"] == want["cutflow"]
    assert_same_histograms(got, want)
    jets = sum(entry["jets"] for entry in want["cutflow"].values())
    assert got["inference"]["jet_tagger"].rows == jets
    assert _total(got["inference"]).fallback_rows == 0


class _Fault:
    """Strikes ``strike()`` once the servers answer rows beyond ``baseline`` (the run is under
    way), then ``undo()`` once ``undo_when(rows_since_strike)`` holds or the run has ended."""

    def __init__(self, facility: Facility, strike: Callable[[], None], undo: Callable[[], None],
                 undo_when: Callable[[int], bool] = lambda rows: rows > 0) -> None:
        self.facility, self.strike, self.undo, self.undo_when = facility, strike, undo, undo_when
        # counted once the servers have counted the previous run's last answers (Triton counts
        # a request just after answering it): a low baseline would strike before the run
        self.baseline = settled(lambda: _served_rows(facility), gap_s=0.2)
        self.struck = threading.Event()
        self.run_over = threading.Event()
        self.thread = CheckedThread(self._watch, name="fault")

    def __enter__(self) -> "_Fault":
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.run_over.set()
        self.thread.finish(timeout=120)

    def _watch(self) -> None:
        try:
            wait_for(lambda: self.run_over.is_set() or _served_rows(self.facility) > self.baseline,
                     RUN_TIMEOUT_S, "the run to infer on the servers", interval=0.02)
            if self.run_over.is_set():
                return
            self.strike()
            self.struck.set()
            at_strike = _served_rows(self.facility)
            wait_for(lambda: self.run_over.is_set() or self.undo_when(
                _served_rows(self.facility) - at_strike), RUN_TIMEOUT_S, "the moment to undo",
                interval=0.05)
        finally:
            self.undo()


def test_the_demo_runs_across_hosts_behind_the_gateway(
        facility: Facility, tmp_path: Path, sample: dict[str, list[str]],
        single_host: dict[str, Any]):
    output = tmp_path / "demo"
    fileset = tmp_path / "fileset.json"
    fileset.write_text(json.dumps(sample))
    env = {**os.environ, **facility.worker_env}
    result = subprocess.run(
        [sys.executable, "-m", "coffea_sonic.cli", "demo", "--server",
         f"triton+grpc://{facility.gateway.address}", "--scheduler", facility.scheduler,
         "--fileset", str(fileset), "--chunksize", str(CHUNKSIZE), "--no-progress",
         "--output", str(output)], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["workers"] == 2
    assert summary["cutflow"] == {name: {key: int(value) for key, value in entry.items()}
                                  for name, entry in single_host["cutflow"].items()}
    jets = sum(entry["jets"] for entry in single_host["cutflow"].values())
    for name in DEMO_MODELS:
        assert summary["client"][name]["fallback_rows"] == 0, name
    assert summary["client"]["jet_tagger"]["rows"] == jets
    assert (output / "scores.png").stat().st_size > 0


def test_check_on_the_workers_says_they_send_over_grpc_because_the_server_is_elsewhere(
        facility: Facility, dask_client: Any):
    result = subprocess.run(
        [sys.executable, "-m", "coffea_sonic.cli", "check", facility.url("jet_tagger"),
         "--token-file", str(facility.token_file), "--on-workers", facility.scheduler,
         "--no-color", "--pings", "1"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for worker in ("worker1", "worker2"):
        assert f"(from {worker})" in result.stdout
    lines = [line for line in result.stdout.splitlines() if "transport" in line]
    assert len(lines) == 2 and all(
        "over grpc: shared memory is not used: the server is not on this host" in line
        for line in lines), lines


def test_the_analysis_across_hosts_gives_the_single_host_histograms(
        facility: Facility, dask_client: Any, sample: dict[str, list[str]],
        single_host: dict[str, Any]):
    across = _run_across(facility, dask_client, sample)
    _assert_nothing_lost(across, single_host)
    assert _total(across["inference"]).failed_requests == 0
    # every worker host did some of the work, and both servers answered
    workers = {worker["host"] for worker in dask_client.scheduler_info()["workers"].values()}
    assert workers == {facility.host(name).ip for name in ("worker1", "worker2")}


def test_a_server_hosts_link_cut_mid_run_and_restored_loses_nothing(
        facility: Facility, dask_client: Any, sample: dict[str, list[str]],
        single_host: dict[str, Any]):
    gpu1 = facility.host("gpu1")
    with _Fault(facility, lambda: facility.lab.cut(gpu1), lambda: facility.lab.restore(gpu1),
                undo_when=lambda rows: rows > 2 * CHUNKSIZE):
        result = _run_across(facility, dask_client, sample)
    _assert_nothing_lost(result, single_host)
    wait_for(facility.tritons[0].ready, 60, "gpu1 to answer again after its link came back")


def test_the_gateway_killed_mid_run_and_restarted_loses_nothing(
        facility: Facility, dask_client: Any, sample: dict[str, list[str]],
        single_host: dict[str, Any]):
    gateway = facility.gateway

    def kill() -> None:
        gateway.kill()
        assert not port_open(gateway.address)

    with _Fault(facility, kill, gateway.restart, undo_when=lambda rows: True) as fault:
        result = _run_across(facility, dask_client, sample)
    assert fault.struck.is_set(), "the run ended before the gateway could be killed"
    _assert_nothing_lost(result, single_host)
    assert _total(result["inference"]).failed_requests > 0


def test_a_link_degraded_to_a_tenth_mid_run_loses_nothing_without_a_timeout_storm(
        facility: Facility, dask_client: Any, sample: dict[str, list[str]],
        single_host: dict[str, Any]):
    worker1 = facility.host("worker1")
    rate = worker1.link.rate_mbit
    with _Fault(facility, lambda: facility.lab.set_link(worker1, Link(rate / 10)),
                lambda: facility.lab.set_link(worker1, Link(rate)),
                undo_when=lambda rows: False) as fault:
        result = _run_across(facility, dask_client, sample)
    assert fault.struck.is_set()
    _assert_nothing_lost(result, single_host)
    assert _total(result["inference"]).failed_requests == 0


def test_a_worker_host_cut_off_mid_run_is_replaced_by_dask_and_loses_nothing(
        facility: Facility, dask_client: Any, sample: dict[str, list[str]],
        single_host: dict[str, Any]):
    worker1 = facility.host("worker1")
    try:
        with _Fault(facility, lambda: facility.lab.cut(worker1), lambda: None,
                    undo_when=lambda rows: False) as fault:
            result = _run_across(facility, dask_client, sample)
        assert fault.struck.is_set()
        _assert_nothing_lost(result, single_host)
        # the scheduler gave up on the silent worker and ran its chunks on the other one
        hosts = {worker["host"] for worker in dask_client.scheduler_info()["workers"].values()}
        assert worker1.ip not in hosts
    finally:
        facility.lab.restore(worker1)
        _restart_worker(facility, dask_client, worker1.name)


def _restart_worker(facility: Facility, client: Any, name: str) -> None:
    """Put a cut-off worker back (a fresh process), so that later tests find two workers."""
    process = next(p for p in facility.workers if p.host.name == name)
    process.stop()
    process.start()
    client.wait_for_workers(2, timeout=120)
    wait_for(lambda: len(client.scheduler_info()["workers"]) == 2, 60, "two workers again")
