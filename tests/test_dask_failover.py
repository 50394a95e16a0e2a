"""A server SIGKILLed during a real coffea ``processor.Runner`` + ``DaskExecutor`` run loses nothing.

Two embedded tritonservers serve the example analysis's models; a Dask ``LocalCluster`` with two
worker processes runs :class:`~coffea_sonic.examples.jet_tagging.JetTaggingProcessor` on a small
synthetic sample, once cleanly and once while one server is killed with SIGKILL after the run's
first chunks are done (the later chunks wait for the kill, so it always lands inside the run,
whatever order Dask picks and however late a server counts). Dask's task retries are off, so any
chunk the client failed to complete would fail the run instead of being silently redone. The
accumulated output must equal the clean run's, and the failure must show in the run's inference
counters. Runs once per transport (plain gRPC and system shared memory).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any, Iterator

import pytest
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from coffea_sonic.data.synthetic import write_sample
from coffea_sonic.examples.jet_tagging import JetTaggingProcessor
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.stats import InferenceStats
from helpers import assert_same_histograms
from outage_run import GatedJetTagging, KillMidRun

MODELS = ("jet_tagger", "particlenet_lite")
QuietSchema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
#: events per dataset and chunk size: many small chunks, so the run outlasts the kill by far
EVENTS_PER_DATASET = 1500
CHUNKSIZE = 100


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Two datasets (``ttbar``, ``qcd_light``), two files each, with PF candidates."""
    return write_sample(tmp_path_factory.mktemp("failover-sample"), events=EVENTS_PER_DATASET,
                        files=2, seed=11)


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    """A Dask ``LocalCluster`` of two single-threaded worker processes, on loopback."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=120)
        yield client


@pytest.fixture()
def two_servers() -> Iterator[tuple[LocalTritonServer, LocalTritonServer]]:
    """Two fresh CPU servers with the example's models (the first one is the victim)."""
    started: list[LocalTritonServer] = []
    try:
        for _ in range(2):
            started.append(LocalTritonServer(models=list(MODELS), device="cpu").start())
        yield started[0], started[1]
    finally:
        for server in started:
            server.stop()


def _models(servers: tuple[LocalTritonServer, ...]) -> dict[str, list[str]]:
    """``{model: [url on every server]}``: each model fails over between the servers."""
    return {name: [server.url(name) for server in servers] for name in MODELS}


def _run(client: Any, fileset: dict[str, list[str]], servers: tuple[LocalTritonServer, ...],
         transport: str, gate: str | None = None) -> dict[str, Any]:
    """The example analysis through ``processor.Runner`` + ``DaskExecutor`` (no task retries)."""
    executor = processor.DaskExecutor(client=client, status=False, retries=0)
    runner = processor.Runner(executor=executor, schema=QuietSchema, chunksize=CHUNKSIZE)
    options: dict[str, Any] = {"transport": transport, "timeout_s": 30.0}
    analysis = (JetTaggingProcessor(_models(servers), **options) if gate is None
                else GatedJetTagging(_models(servers), gate=gate, free_chunks=FREE_CHUNKS,
                                     **options))
    runnable = {name: {"files": {path: "Events" for path in files}} for name, files in fileset.items()}
    return runner(runnable, treename="Events", processor_instance=analysis)


def _served_rows(server: LocalTritonServer) -> int:
    """Rows the server has answered for the example's models (its HTTP statistics endpoint)."""
    total = 0
    for name in MODELS:
        with urllib.request.urlopen(f"http://{server.http_address}/v2/models/{name}/stats",
                                    timeout=5) as response:
            statistics = json.load(response)
        total += sum(int(entry.get("inference_count", 0)) for entry in statistics["model_stats"])
    return total


def _registered_shm_regions(server: LocalTritonServer) -> list[str]:
    """Names of the system shared-memory regions clients registered with ``server``."""
    with urllib.request.urlopen(f"http://{server.http_address}/v2/systemsharedmemory/status",
                                timeout=5) as response:
        return [region["name"] for region in json.load(response)]


#: chunks that run before the victim is killed; every later chunk waits for the kill, so the kill
#: lands inside the run however Dask orders the chunks and however late the server counts
FREE_CHUNKS = 4


def _total(stats: dict[str, InferenceStats]) -> InferenceStats:
    total = InferenceStats()
    for value in stats.values():
        total = total + value
    return total


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_server_sigkilled_mid_dask_run_gives_the_clean_runs_outputs_and_counts_the_failure(
        transport: str, sample: dict[str, list[str]], dask_client: Any, tmp_path: Any,
        two_servers: tuple[LocalTritonServer, LocalTritonServer]) -> None:
    victim, survivor = two_servers
    clean = _run(dask_client, sample, two_servers, transport)
    clean_victim_rows = _served_rows(victim)
    assert clean_victim_rows > 0 and _served_rows(survivor) > 0, \
        "the clean run should spread its requests over both servers"
    assert _total(clean["inference"]).failed_requests == 0
    # the transport asked for is the one the workers use
    regions = _registered_shm_regions(survivor)
    assert bool(regions) == (transport == "shm"), regions

    watcher = KillMidRun(victim, gate=str(tmp_path), free_chunks=FREE_CHUNKS).start()
    try:
        failed_over = _run(dask_client, sample, two_servers, transport, gate=str(tmp_path))
    finally:
        watcher.stop()
        watcher.join()
    assert watcher.killed.is_set()
    assert not victim.running

    # every accumulated output of the analysis is identical to the clean run's
    assert sorted(failed_over) == sorted(clean)
    assert failed_over["cutflow"] == clean["cutflow"]
    assert_same_histograms(failed_over, clean)
    assert sorted(failed_over["inference"]) == sorted(clean["inference"]) == sorted(MODELS)
    for name in MODELS:
        got, want = failed_over["inference"][name], clean["inference"][name]
        assert (got.calls, got.rows) == (want.calls, want.rows), name
        assert got.fallback_rows == 0, name
    total_jets = sum(entry["jets"] for entry in clean["cutflow"].values())
    assert clean["inference"]["jet_tagger"].rows == total_jets

    # the kill happened inside the run, and the client counted it
    total = _total(failed_over["inference"])
    assert total.failed_requests > 0, total
    assert total.retries > 0 and total.failovers > 0, total
