"""When the server dies: the fallback answers in seconds, and the outage stays on record.

A model pickled once (as a processor is shipped to Dask workers) and unpickled fresh per chunk
keeps answering from the fallback within a connect timeout of the server's SIGKILL, on every
transport. Real coffea ``processor.Runner`` + Dask runs of 16 chunks lose the server after their
third chunk: with ``fallback="cpu"`` the run completes with the histograms of a CPU-only run, and
without a fallback it waits for the server that comes back 20 s later; either way the run report
(the output's ``sonic_stats()`` record and ``report.json``) names the outage.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from coffea_sonic import TritonModel
from coffea_sonic.data.synthetic import write_sample
from coffea_sonic.engines import CpuEngine
from coffea_sonic.examples.jet_tagging import JetTaggingProcessor
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.server.launcher import free_port
from coffea_sonic.stats import InferenceStats
from coffea_sonic.zoo import example_inputs
from helpers import assert_same_histograms, assert_sent_over, wait_for
from outage_run import GatedJetTagging, KillMidRun

MODELS = ("jet_tagger", "particlenet_lite")
QuietSchema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
#: 2 datasets x 2 files x 400 events in chunks of 100: 16 chunks
EVENTS_PER_DATASET = 800
CHUNKSIZE = 100
FREE_CHUNKS = 3
#: a generous hang guard on top of the connect timeout, not a speed figure
HANG_GUARD_S = 20.0
CONNECT_TIMEOUT_S = 2.0


def _url(server: LocalTritonServer, model: str, transport: str) -> str:
    if transport == "http":
        return f"triton+http://{server.http_address}/{model}"
    return server.url(model)


@pytest.mark.parametrize("transport", ["grpc", "shm", "http"])
def test_fresh_copies_of_a_pickled_model_fall_back_within_the_connect_timeout_once_the_server_is_killed(
        transport: str) -> None:
    server = LocalTritonServer(models=["jet_tagger"], device="cpu").start()
    try:
        model = TritonModel(_url(server, "jet_tagger", transport), fallback="cpu",
                            transport=transport, connect_timeout_s=CONNECT_TIMEOUT_S)
        shipped = pickle.dumps(model)
        inputs = example_inputs("jet_tagger", 500)
        expected = CpuEngine("jet_tagger")(inputs)["probs"]
        first = pickle.loads(shipped)
        if transport == "http":
            served = first(inputs)
        else:
            served = assert_sent_over(transport, server.grpc_address, lambda: first(inputs))
        assert first.stats.fallback_rows == 0 and first.stats.requests > 0
        np.testing.assert_allclose(served["probs"], expected, atol=1e-6)

        os.kill(server.pid, signal.SIGKILL)
        wait_for(lambda: server.process.poll() is not None, 30, "the killed server to exit")
        for chunk in range(6):  # each Dask task unpickles its own copy
            copy = pickle.loads(shipped)
            started = time.monotonic()
            answer = copy(inputs)["probs"]
            took = time.monotonic() - started
            assert took < CONNECT_TIMEOUT_S + HANG_GUARD_S, (chunk, took)
            np.testing.assert_array_equal(answer, expected)
            assert copy.stats.fallback_rows == len(expected), (chunk, copy.stats)
    finally:
        server.stop()


# -- a real coffea + Dask run that loses its server -----------------------------------------------

@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    return write_sample(tmp_path_factory.mktemp("outage-sample"), events=EVENTS_PER_DATASET,
                        files=2, seed=5)


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    """A Dask ``LocalCluster`` of two single-threaded worker processes, on loopback."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=120)
        yield client


@pytest.fixture(autouse=True)
def _reports_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run reports go to this test's folder (the driver resolves it for the workers)."""
    monkeypatch.setenv("COFFEA_SONIC_REPORT_DIR", str(tmp_path / "runs"))


def _runnable(fileset: dict[str, list[str]]) -> dict[str, Any]:
    return {name: {"files": {path: "Events" for path in files}} for name, files in fileset.items()}


def _run(client: Any, fileset: dict[str, list[str]], analysis: Any) -> dict[str, Any]:
    """``analysis`` through ``processor.Runner`` + ``DaskExecutor`` (no task retries)."""
    executor = processor.DaskExecutor(client=client, status=False, retries=0)
    runner = processor.Runner(executor=executor, schema=QuietSchema, chunksize=CHUNKSIZE)
    return runner(_runnable(fileset), treename="Events", processor_instance=analysis)


def _models(address: str) -> dict[str, str]:
    return {name: f"triton+grpc://{address}/{name}" for name in MODELS}


def _total(stats: dict[str, InferenceStats]) -> InferenceStats:
    return sum(stats.values(), InferenceStats())


@pytest.fixture(scope="module")
def cpu_only(dask_client: Any, sample: dict[str, list[str]], tmp_path_factory) -> dict[str, Any]:
    """The same analysis with no server at all: every row from the CPU fallback."""
    nowhere = f"127.0.0.1:{free_port()}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COFFEA_SONIC_REPORT_DIR", str(tmp_path_factory.mktemp("cpu-only")))
        output = _run(dask_client, sample, JetTaggingProcessor(
            _models(nowhere), fallback="cpu", connect_timeout_s=CONNECT_TIMEOUT_S))
    total = _total(output["inference"])
    assert total.rows > 0 and total.fallback_rows == total.rows, total
    return output


def _victim(port: int | None = None, http_port: int | None = None) -> LocalTritonServer:
    options = {} if port is None else {"grpc_port": port, "http_port": http_port}
    return LocalTritonServer(models=list(MODELS), device="cpu", **options).start()


def _report(output: dict[str, Any]) -> dict[str, Any]:
    """The report.json the run wrote (found through the output's record of its run)."""
    found = sorted(Path(os.environ["COFFEA_SONIC_REPORT_DIR"]).glob("*/report.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_a_dask_run_with_the_cpu_fallback_completes_when_its_server_dies_and_reports_the_outage(
        transport: str, dask_client: Any, sample: dict[str, list[str]],
        cpu_only: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    victim = _victim()
    gate = tmp_path / "gate"
    gate.mkdir()
    watcher = KillMidRun(victim, gate=str(gate), free_chunks=FREE_CHUNKS).start()
    try:
        analysis = GatedJetTagging(_models(victim.grpc_address), gate=str(gate),
                                   free_chunks=FREE_CHUNKS, fallback="cpu", transport=transport)
        output = _run(dask_client, sample, analysis)
    finally:
        watcher.stop()
        watcher.join()
        victim.stop()
    assert watcher.killed.is_set()

    assert output["cutflow"] == cpu_only["cutflow"]
    assert_same_histograms(output, cpu_only)
    total = _total(output["inference"])
    assert total.rows == _total(cpu_only["inference"]).rows
    assert 0 < total.fallback_rows < total.rows, total  # served before the kill, fallback after

    record = output["inference"].incidents
    quarantined = [i for i in record if i.kind == "quarantined"]
    assert quarantined and {i.server for i in quarantined} == {victim.grpc_address}, list(record)
    assert all(i.first >= watcher.killed_at - 1 for i in quarantined)
    by_fallback = [i for i in record if i.kind == "fallback"]
    assert sum(i.rows for i in by_fallback) == total.fallback_rows
    assert len(record.chunks("fallback")) >= 16 - FREE_CHUNKS - 1

    report = _report(output)
    assert report["incident_totals"]["fallback"]["rows"] == total.fallback_rows
    # the demo's summary (the same output) shows the record too
    from coffea_sonic.demo import print_summary, summarise

    summary = summarise(output, wall_s=1.0, workers=2, server_delta={})
    assert any("quarantined" in line and victim.grpc_address in line
               for line in summary["incidents"]), summary["incidents"]
    print_summary(summary)
    assert "incidents" in capsys.readouterr().out
    assert any(i["server"] == victim.grpc_address and i["kind"] == "quarantined"
               for i in report["incidents"])


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_a_dask_run_without_fallback_waits_for_its_restarted_server_and_reports_outage_and_retries(
        transport: str, dask_client: Any, sample: dict[str, list[str]],
        cpu_only: dict[str, Any], tmp_path: Path) -> None:
    victim = _victim()
    ports = victim.ports["grpc"], victim.ports["http"]
    gate = tmp_path / "gate"
    gate.mkdir()
    watcher = KillMidRun(victim, gate=str(gate), free_chunks=FREE_CHUNKS,
                         restart=lambda: _victim(*ports), restart_after_s=20.0).start()
    try:
        analysis = GatedJetTagging(_models(victim.grpc_address), gate=str(gate),
                                   free_chunks=FREE_CHUNKS, transport=transport)
        output = _run(dask_client, sample, analysis)
    finally:
        watcher.stop()
        watcher.join()
        victim.stop()
        if watcher.restarted is not None:
            watcher.restarted.stop()
    assert watcher.killed.is_set() and watcher.restarted is not None

    assert output["cutflow"] == cpu_only["cutflow"]
    total = _total(output["inference"])
    assert total.rows == _total(cpu_only["inference"]).rows and total.fallback_rows == 0
    assert total.failed_requests > 0 and total.retries > 0, total

    record = output["inference"].incidents
    kinds = record.totals()
    assert {"quarantined", "readmitted", "retried"} <= set(kinds), kinds
    readmitted = [i for i in record if i.kind == "readmitted"]
    assert all(i.server == victim.grpc_address for i in readmitted)
    assert min(i.first for i in readmitted) >= watcher.killed_at + 19
    report = _report(output)
    assert report["incident_totals"]["retried"]["count"] == kinds["retried"]["count"]


def test_a_server_started_from_a_thread_keeps_running_after_that_thread_ends() -> None:
    """The parent-death signal follows the thread that forked the server; a server restarted by
    a short-lived thread (as the restart above is) must outlive it."""
    from helpers import CheckedThread

    started: list[LocalTritonServer] = []
    thread = CheckedThread(lambda: started.append(_victim()), name="starts-a-server")
    thread.start()
    thread.finish(timeout=120)
    server = started[0]
    try:
        model = TritonModel(server.url("jet_tagger"), transport="grpc")
        inputs = example_inputs("jet_tagger", 10)
        for _ in range(3):  # answers well after the starting thread is gone
            assert model(inputs)["probs"].shape == (10, 3)
            assert server.process.poll() is None
            time.sleep(0.5)  # lets a parent-death signal land if one was coming
    finally:
        server.stop()


class FailsOnce(JetTaggingProcessor):
    """The example analysis whose first attempt at one chunk fails (after its inference)."""

    def __init__(self, *args: Any, flag: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flag = flag

    def process(self, events: Any) -> dict[str, Any]:
        output = super().process(events)
        if events.metadata["entrystart"] == 100 and not os.path.exists(self.flag):
            Path(self.flag).touch()
            raise RuntimeError("the worker ran out of luck")
        return output


def test_a_chunk_attempt_that_coffea_retried_stays_on_the_runs_record(
        dask_client: Any, sample: dict[str, list[str]], tmp_path: Path) -> None:
    server = _victim()
    try:
        executor = processor.DaskExecutor(client=dask_client, status=False, retries=1)
        runner = processor.Runner(executor=executor, schema=QuietSchema, chunksize=CHUNKSIZE)
        analysis = FailsOnce(_models(server.grpc_address), flag=str(tmp_path / "failed"))
        output = runner(_runnable(sample), treename="Events", processor_instance=analysis)
    finally:
        server.stop()
    assert (tmp_path / "failed").exists()
    failed = [i for i in output["inference"].incidents if i.kind == "failed_attempt"]
    assert len(failed) == 1 and failed[0].count == 1, list(output["inference"].incidents)
    assert ":100-200" in failed[0].chunk and "out of luck" in failed[0].detail
    assert "RuntimeError" in failed[0].detail
    assert _report(output)["incident_totals"]["failed_attempt"]["count"] == 1
