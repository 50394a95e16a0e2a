"""The analysis across hosts: Dask workers on two worker hosts, two tritonservers on two server hosts
behind the HAProxy gateway (JWT tokens), each host a network namespace with its own /dev/shm and a
1 Gb/s link (coffea_sonic.netlab.Facility). The demo runs there; the example analysis gives the
single-host run's histograms, also while a fault strikes mid-run: a server host's link cut and
restored, the gateway killed and restarted, a worker host cut off, a link degraded to 10 %.

A fault is struck by a watcher thread as soon as the servers' own statistics show that the run is
inferring (a condition, not a delay), and undone on a condition too. Every fault test first proves
that its fault struck where it claims: the killed process' exit status, a probe that the cut host
no longer answers, the kernel's shaping read back inside the host, the gateway's own statistics
(HAProxy marking a server down), and each server's own row counts before, at and after the fault.
Dask's task retries are off: a chunk the client failed would fail the run instead of being
redone. Needs root."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

import pytest
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from coffea_sonic.data.synthetic import write_sample
from coffea_sonic.demo import DEMO_MODELS
from coffea_sonic.examples.jet_tagging import JetTaggingProcessor
from coffea_sonic.incidents import read_journal
from coffea_sonic.netlab import Link, missing_requirements, port_open
from facility import Facility
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


def _on_one_host(sample: dict[str, list[str]]) -> dict[str, Any]:
    """The example analysis on one host: an embedded server, coffea's iterative executor."""
    with LocalTritonServer(models=list(DEMO_MODELS), device="cpu") as server:
        analysis = JetTaggingProcessor(f"triton+grpc://{server.grpc_address}", physics=True)
        return _runner(processor.IterativeExecutor(status=False))(
            _runnable(sample), treename="Events", processor_instance=analysis)


@pytest.fixture(scope="module")
def single_host(sample: dict[str, list[str]]) -> dict[str, Any]:
    return _on_one_host(sample)


@pytest.fixture(scope="module")
def long_sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Three times the sample: a run long enough that a fault struck at its start leaves the
    gateway's health checks time to act while it goes on."""
    return write_sample(tmp_path_factory.mktemp("multihost-long-sample"),
                        events=3 * EVENTS_PER_DATASET, files=2, seed=23)


@pytest.fixture(scope="module")
def long_single_host(long_sample: dict[str, list[str]]) -> dict[str, Any]:
    return _on_one_host(long_sample)


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


def _run_across(facility: Facility, client: Any, sample: dict[str, list[str]]
                ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The example analysis on the worker hosts, served behind the gateway (no task retries):
    its output, and Dask's task stream of the run (which worker ran what, when)."""
    from distributed import get_task_stream

    analysis = JetTaggingProcessor(f"triton+grpc://{facility.gateway.address}", physics=True)
    executor = processor.DaskExecutor(client=client, status=False, retries=0)
    with get_task_stream(client) as stream:
        output = _runner(executor)(_runnable(sample), treename="Events",
                                   processor_instance=analysis)
    return output, list(stream.data)


def _rows_by_server(facility: Facility) -> list[int | None]:
    """Rows each server has answered, all models together (its own HTTP statistics, read from the
    submitting host), in the order of ``facility.tritons``; None for a server out of reach (its
    link cut)."""
    rows: list[int | None] = []
    for triton in facility.tritons:
        total: int | None = 0
        for name in DEMO_MODELS:
            url = f"http://{triton.http_address}/v2/models/{name}/stats"
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    statistics = json.load(response)
            except OSError:
                total = None
                break
            total += sum(int(entry.get("inference_count", 0)) for entry in statistics["model_stats"])
        rows.append(total)
    return rows


def _served_rows(facility: Facility) -> int:
    """Rows the servers in reach have answered."""
    return sum(rows or 0 for rows in _rows_by_server(facility))


def _settled_rows(facility: Facility) -> list[int | None]:
    """:func:`_rows_by_server` once the servers have counted their last answers (Triton counts a
    request just after answering it)."""
    return settled(lambda: _rows_by_server(facility), gap_s=0.2)


def _gateway_servers(facility: Facility) -> dict[str, dict[str, str]]:
    """The gateway's own view of its gRPC servers (HAProxy's statistics, CSV), by server name
    (``triton1``, ``triton2``: ``facility.tritons`` in order): ``status`` (UP, DOWN, ...),
    ``chkdown`` (times its health checks marked the server down), ``stot`` (calls sent to it)."""
    url = f"http://{facility.gateway.stats_address}/stats;csv"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {row["svname"]: row for row in csv.DictReader(io.StringIO(text.removeprefix("# ")))
            if row["pxname"] == "tritons" and row["svname"] != "BACKEND"}


def _streams_in_flight(facility: Facility) -> int:
    """Calls the gateway is passing to its servers at this moment (HAProxy's ``scur``: each
    gRPC call is a stream of its own there; a connection without a call counts none)."""
    return sum(int(row["scur"] or 0) for row in _gateway_servers(facility).values())


def _marked_down(facility: Facility, server: str) -> int:
    return int(_gateway_servers(facility)[server]["chkdown"])


def _worker_address(client: Any, host_ip: str) -> str:
    """``ip:port`` of the Dask worker on the host at ``host_ip``."""
    (address,) = [address for address, worker in client.scheduler_info()["workers"].items()
                  if worker["host"] == host_ip]
    return address.removeprefix("tcp://")


def _chunk_tasks(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task stream's records of tasks that processed chunks (coffea names them after the
    processor; its preprocessing and reductions are named otherwise)."""
    prefix = f"{JetTaggingProcessor.__name__}-"
    return [task for task in tasks if str(task["key"]).startswith(prefix)]


def _finished_after(tasks: list[dict[str, Any]], when: float) -> list[dict[str, Any]]:
    """Chunk tasks (:func:`_chunk_tasks`) that finished after ``when`` (``time.time()``)."""
    return [task for task in _chunk_tasks(tasks)
            if max(span["stop"] for span in task["startstops"]) > when]


def _hosts_of(tasks: list[dict[str, Any]]) -> set[str]:
    return {urlparse(task["worker"]).hostname for task in tasks}


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
    """Strikes ``strike()`` once the servers answer rows beyond what they had answered before the
    run (the run is under way) and ``strike_when()`` holds, then ``undo()`` once
    ``undo_when(fault)`` holds or the run has ended. Each server's rows are on record at every
    step (``baseline``, ``at_strike``, ``at_undo``, ``after_undo``: per server, None where out of
    reach), ``struck_at`` is the time of the strike (``time.time()``, the clock of Dask's task
    stream) and ``undone_on_condition`` says whether ``undo_when`` held while the run was going."""

    def __init__(self, facility: Facility, strike: Callable[[], None], undo: Callable[[], None],
                 undo_when: Callable[["_Fault"], bool] = lambda fault: True,
                 strike_when: Callable[[], bool] = lambda: True) -> None:
        self.facility, self.strike, self.undo, self.undo_when = facility, strike, undo, undo_when
        self.strike_when = strike_when
        # counted once the servers have counted the previous run's last answers: a low baseline
        # would strike before the run
        self.baseline = _settled_rows(facility)
        self.at_strike: list[int | None] = []
        self.at_undo: list[int | None] = []
        self.after_undo: list[int | None] = []
        self.struck_at = 0.0
        self.undone_on_condition = False
        self.struck = threading.Event()
        self.run_over = threading.Event()
        self.thread = CheckedThread(self._watch, name="fault")

    def answered_since_strike(self, server: int) -> int:
        """Rows server ``server`` (index in ``facility.tritons``) answered since the strike
        (0 while it is out of reach)."""
        now, then = _rows_by_server(self.facility)[server], self.at_strike[server]
        return 0 if now is None else now - (then or 0)

    def __enter__(self) -> "_Fault":
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.run_over.set()
        self.thread.finish(timeout=120)

    def _watch(self) -> None:
        before = sum(rows or 0 for rows in self.baseline)
        try:
            wait_for(lambda: self.run_over.is_set() or _served_rows(self.facility) > before,
                     RUN_TIMEOUT_S, "the run to infer on the servers", interval=0.02)
            wait_for(lambda: self.run_over.is_set() or self.strike_when(), RUN_TIMEOUT_S,
                     "the moment to strike", interval=0.005)
            if self.run_over.is_set():
                return
            self.struck_at = time.time()
            self.strike()
            self.struck.set()
            self.at_strike = _rows_by_server(self.facility)
            self.undone_on_condition = wait_for(
                lambda: "condition" if self.undo_when(self) else (
                    "run over" if self.run_over.is_set() else None),
                RUN_TIMEOUT_S, "the moment to undo", interval=0.05) == "condition"
        finally:
            if self.struck.is_set():
                self.at_undo = _rows_by_server(self.facility)
            self.undo()
            if self.struck.is_set():
                self.after_undo = _rows_by_server(self.facility)


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
    before = _settled_rows(facility)
    across, tasks = _run_across(facility, dask_client, sample)
    answered = [after - earlier for after, earlier in zip(_settled_rows(facility), before)]
    _assert_nothing_lost(across, single_host)
    assert _total(across["inference"]).failed_requests == 0
    # both servers answered (their own statistics), and between them every row the client got,
    # each once
    assert all(rows > 0 for rows in answered), answered
    assert sum(answered) == sum(across["inference"][name].rows for name in DEMO_MODELS), answered
    # every worker host processed chunks
    assert _hosts_of(_chunk_tasks(tasks)) == {facility.host(name).ip
                                              for name in ("worker1", "worker2")}


def test_a_server_hosts_link_cut_mid_run_and_restored_loses_nothing(
        facility: Facility, dask_client: Any, long_sample: dict[str, list[str]],
        long_single_host: dict[str, Any]):
    gpu1, first = facility.host("gpu1"), facility.tritons[0]
    down_before = _marked_down(facility, "triton1")

    def cut() -> None:
        facility.lab.cut(gpu1)
        # the link is down: gpu1 answers nothing from here any more
        assert not port_open(first.grpc_address) and not first.ready()

    def failed_over(fault: _Fault) -> bool:
        # the gateway's own health checks took gpu1 out of the rotation, and gpu2 answered the
        # run's rows since the cut
        return (_marked_down(facility, "triton1") > down_before
                and fault.answered_since_strike(1) > 2 * CHUNKSIZE)

    with _Fault(facility, cut, lambda: facility.lab.restore(gpu1), undo_when=failed_over) as fault:
        result, _ = _run_across(facility, dask_client, long_sample)
    assert fault.struck.is_set(), "the run ended before gpu1's link could be cut"
    assert fault.at_strike[0] is None and fault.at_undo[0] is None, "gpu1 answered while cut"
    assert fault.undone_on_condition, (
        f"the run ended before the gateway marked gpu1 down ({_gateway_servers(facility)}) and "
        f"gpu2 answered the run's rows (rows by server at the cut {fault.at_strike}, at the end "
        f"{fault.at_undo})")
    # the cut struck the run (above: the gateway marked gpu1 down while gpu2 answered the run's
    # rows); whether a call was on gpu1's link at that moment (then reset and sent again) depends
    # on where the workers were, so retries are not asserted
    _assert_nothing_lost(result, long_single_host)
    # back on the network, gpu1 answers and the gateway takes it back into the rotation
    wait_for(first.ready, 60, "gpu1 to answer again after its link came back")
    wait_for(lambda: _gateway_servers(facility)["triton1"]["status"] == "UP", 60,
             lambda: f"the gateway to mark gpu1 up again: {_gateway_servers(facility)}")


def test_the_gateway_killed_mid_run_and_restarted_loses_nothing(
        facility: Facility, dask_client: Any, sample: dict[str, list[str]],
        single_host: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    gateway = facility.gateway
    # the run's journal (where workers record at once that they quarantined a server) lands here
    monkeypatch.setenv("COFFEA_SONIC_REPORT_DIR", str(tmp_path))

    def kill() -> None:
        gateway.kill()
        # HAProxy died of the SIGKILL and its port is closed
        assert gateway.process.process.returncode == -signal.SIGKILL
        assert not gateway.process.alive and not port_open(gateway.address)

    def clients_noticed(fault: _Fault) -> bool:
        # the gateway stays down until a worker found it gone: a chunk's calls are seconds
        # apart, and a restart at once would often come before the next one; but not so long
        # that a call's retries run out (about 1.5 s by default)
        return (any(incident.kind == "quarantined" and incident.server == gateway.address
                    for folder in tmp_path.glob("*/journal") for incident in read_journal(folder))
                or time.time() > fault.struck_at + 1.0)

    # struck while the gateway passes a call: that call is cut, a failure the clients must see
    with _Fault(facility, kill, gateway.restart, undo_when=clients_noticed,
                strike_when=lambda: _streams_in_flight(facility) > 0) as fault:
        result, _ = _run_across(facility, dask_client, sample)
    assert fault.struck.is_set(), "the run ended before the gateway could be killed"
    assert gateway.process.alive and port_open(gateway.address)
    _assert_nothing_lost(result, single_host)
    # the clients saw calls fail while the gateway was gone, and the run went on through the
    # restarted one: the servers answered rows after the restart
    assert _total(result["inference"]).failed_requests > 0
    assert any(incident.kind == "quarantined" and incident.server == gateway.address
               for incident in result["inference"].incidents), result["inference"].incidents
    after = _settled_rows(facility)
    assert sum(after) > sum(fault.after_undo), (fault.after_undo, after)


def test_a_link_degraded_to_a_tenth_mid_run_loses_nothing_without_a_timeout_storm(
        facility: Facility, dask_client: Any, sample: dict[str, list[str]],
        single_host: dict[str, Any]):
    worker1 = facility.host("worker1")
    rate = worker1.link.rate_mbit

    def shaped_mbit() -> float | None:
        """The rate the kernel shapes worker1's side of its link at (its tbf, read back inside
        the host); None where nothing shapes it."""
        qdiscs = json.loads(worker1.run(["tc", "-j", "qdisc", "show", "dev", "eth0"]).stdout)
        rates = [qdisc["options"]["rate"] for qdisc in qdiscs if qdisc["kind"] == "tbf"]
        return rates[0] * 8 / 1e6 if rates else None

    def degrade() -> None:
        facility.lab.set_link(worker1, Link(rate / 10))
        assert shaped_mbit() == pytest.approx(rate / 10)

    with _Fault(facility, degrade, lambda: facility.lab.set_link(worker1, Link(rate)),
                undo_when=lambda fault: False) as fault:
        result, tasks = _run_across(facility, dask_client, sample)
    assert fault.struck.is_set()
    assert shaped_mbit() == pytest.approx(rate)
    _assert_nothing_lost(result, single_host)
    assert _total(result["inference"]).failed_requests == 0
    # worker1 finished chunks over the degraded link
    assert worker1.ip in _hosts_of(_finished_after(tasks, fault.struck_at)), tasks


def test_a_worker_host_cut_off_mid_run_is_replaced_by_dask_and_loses_nothing(
        facility: Facility, dask_client: Any, sample: dict[str, list[str]],
        single_host: dict[str, Any]):
    worker1 = facility.host("worker1")
    address = _worker_address(dask_client, worker1.ip)

    def cut() -> None:
        facility.lab.cut(worker1)
        # the link is down: worker1's Dask worker answers nothing from here any more
        assert not port_open(address)

    try:
        with _Fault(facility, cut, lambda: None, undo_when=lambda fault: False) as fault:
            result, tasks = _run_across(facility, dask_client, sample)
        assert fault.struck.is_set()
        _assert_nothing_lost(result, single_host)
        # the scheduler gave up on the silent worker and ran its chunks on the other one
        hosts = {worker["host"] for worker in dask_client.scheduler_info()["workers"].values()}
        assert worker1.ip not in hosts
        assert _hosts_of(_finished_after(tasks, fault.struck_at)) == {
            facility.host("worker2").ip}, tasks
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
