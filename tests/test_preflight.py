"""Mistakes are caught before the run: the preflight checks a processor's models once, on the
driver, before coffea submits a chunk.

coffea retries every exception a chunk raises (the executors' ``retries=3``), so without the
preflight a wrong model name fails 16 chunks four times each. Here each mistake (a model the
server does not serve, inputs that do not fit the model, a token the HAProxy gateway refuses)
ends a real 16-chunk run within seconds, with no chunk started, and a message of at most five
lines that names the model, the server and the fix.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import awkward as ak
import pytest
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from coffea_sonic import SonicMixin, columns
from coffea_sonic.core.secrets import Secret
from coffea_sonic.data.synthetic import write_sample
from coffea_sonic.errors import ModelNotFoundError, PreflightError
from coffea_sonic.netlab import LocalHost
from coffea_sonic.netlab.gateway import start_gateway
from coffea_sonic.netlab.tokens import TokenIssuer
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.server.launcher import free_port

QuietSchema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
#: a mistake must end the run this fast: a generous bound for a loaded 2-core box, far below
#: one retried chunk's cost
WITHIN_S = 30.0


class Tagger(SonicMixin, processor.ProcessorABC):
    """Scores every jet; each chunk leaves a mark in ``marks`` (to prove none started)."""

    def __init__(self, url: str, marks: str, inputs: dict | None = None, **options: Any) -> None:
        self.sonic_configure({"jet_tagger": url}, **options)
        self.marks = marks
        if inputs is not None:
            self.sonic_inputs = {"jet_tagger": inputs}

    def process(self, events: Any) -> dict[str, Any]:
        Path(self.marks, uuid.uuid4().hex).touch()
        jets = events.Jet
        scores = self.infer("jet_tagger", {"features": columns.jet_features(jets)}, like=jets)
        return {"jets": int(ak.sum(ak.num(scores["probs"], axis=1))),
                "inference": self.sonic_stats()}

    def postprocess(self, accumulator: Any) -> Any:
        return accumulator


@pytest.fixture(scope="module")
def fileset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """16 chunks: 2 datasets x 2 files x 200 events in chunks of 50."""
    files = write_sample(tmp_path_factory.mktemp("preflight-sample"), events=400, files=2, seed=3)
    return {name: {"files": {path: "Events" for path in paths}} for name, paths in files.items()}


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=120)
        yield client


def _executor(kind: str, client: Any) -> Any:
    if kind == "dask":  # coffea's default retries: what the preflight spares the user
        return processor.DaskExecutor(client=client, status=False)
    return processor.FuturesExecutor(workers=2, status=False)


def _run(executor: Any, fileset: dict[str, Any], analysis: Tagger) -> Any:
    runner = processor.Runner(executor=executor, schema=QuietSchema, chunksize=50)
    return runner(fileset, treename="Events", processor_instance=analysis)


def _refused(executor: Any, fileset: dict[str, Any], analysis: Tagger) -> str:
    """The run's error, after checking it came fast, before any chunk, in a few lines."""
    started = time.monotonic()
    with pytest.raises(PreflightError) as raised:
        _run(executor, fileset, analysis)
    took = time.monotonic() - started
    assert took < WITHIN_S, took
    assert os.listdir(analysis.marks) == [], "a chunk started before the mistake was caught"
    message = str(raised.value)
    assert len(message.splitlines()) <= 5, message
    assert "what to do:" in message
    return message


@pytest.mark.parametrize("kind", ["dask", "futures"])
def test_a_wrong_model_name_ends_the_run_before_any_chunk(
        kind: str, dask_client: Any, fileset: dict[str, Any], jet_tagger_server: LocalTritonServer,
        tmp_path: Path) -> None:
    url = f"triton+grpc://{jet_tagger_server.grpc_address}/jet_taggr"
    message = _refused(_executor(kind, dask_client), fileset, Tagger(url, str(tmp_path)))
    assert "jet_taggr" in message and jet_tagger_server.grpc_address in message
    assert "jet_tagger" in message  # what the server does serve


@pytest.mark.parametrize("transport", ["grpc", "shm", "http"])
def test_inputs_that_do_not_fit_the_model_end_the_run_before_any_chunk(
        transport: str, dask_client: Any, fileset: dict[str, Any],
        jet_tagger_server: LocalTritonServer, tmp_path: Path) -> None:
    url = (f"triton+http://{jet_tagger_server.http_address}/jet_tagger" if transport == "http"
           else jet_tagger_server.url("jet_tagger"))
    analysis = Tagger(url, str(tmp_path), inputs={"features": ("float32", (7,))},
                      transport=transport)
    message = _refused(_executor("dask", dask_client), fileset, analysis)
    assert "'features'" in message and "[7]" in message and "[6]" in message
    assert "jet_tagger" in message and url in message


def test_inputs_that_fit_pass_the_preflight_and_the_run_completes(
        dask_client: Any, fileset: dict[str, Any], jet_tagger_server: LocalTritonServer,
        tmp_path: Path) -> None:
    analysis = Tagger(jet_tagger_server.url("jet_tagger"), str(tmp_path),
                      inputs={"features": ("float32", (6,))})
    output = _run(processor.DaskExecutor(client=dask_client, status=False, retries=0), fileset,
                  analysis)
    assert len(os.listdir(tmp_path)) == 16
    assert output["jets"] == output["inference"]["jet_tagger"].rows > 0


def test_with_the_preflight_off_the_mistake_surfaces_in_the_chunks(
        dask_client: Any, fileset: dict[str, Any], jet_tagger_server: LocalTritonServer,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COFFEA_SONIC_PREFLIGHT", "off")
    url = f"triton+grpc://{jet_tagger_server.grpc_address}/jet_taggr"
    with pytest.raises(Exception) as raised:
        _run(processor.DaskExecutor(client=dask_client, status=False, retries=0), fileset,
             Tagger(url, str(tmp_path)))
    assert not isinstance(raised.value, PreflightError)
    assert isinstance(raised.value, ModelNotFoundError) or "jet_taggr" in str(raised.value)
    assert os.listdir(tmp_path), "with the preflight off the chunks run and fail"


@pytest.fixture(scope="module")
def gateway(jet_tagger_server: LocalTritonServer) -> Iterator[tuple[Any, TokenIssuer, Path]]:
    """HAProxy from deploy/haproxy/gateway.cfg in front of the server, with its token issuer."""
    folder = Path(tempfile.mkdtemp(prefix="preflight-gateway-"))
    with LocalHost(folder / "logs") as here:
        issuer = TokenIssuer(folder / "issuer")
        started = start_gateway(
            here, [(jet_tagger_server.grpc_address, jet_tagger_server.ports["http"])],
            public_key=issuer.public_key, directory=folder / "gateway", quota_rps=100,
            retry_after_s=0.3, port=free_port(), stats_port=free_port(), http_port=free_port())
        yield started, issuer, folder


def test_a_token_the_gateway_refuses_ends_the_run_before_any_chunk(
        dask_client: Any, fileset: dict[str, Any], gateway: tuple[Any, TokenIssuer, Path],
        tmp_path: Path) -> None:
    started, issuer, folder = gateway
    forged = TokenIssuer(folder / "other-issuer").write(folder / "forged.token", "mallory")
    headers = {"authorization": Secret.from_file(str(forged), prefix="Bearer ")}
    analysis = Tagger(started.url("jet_tagger", "grpc"), str(tmp_path), headers=headers,
                      transport="grpc")
    message = _refused(_executor("dask", dask_client), fileset, analysis)
    assert "jet_tagger" in message and started.address in message
    assert "token" in message.lower()
    # the right token passes the same preflight and the run completes
    good = issuer.write(folder / "alice.token", "alice")
    analysis = Tagger(started.url("jet_tagger", "grpc"), str(tmp_path / "good"), transport="grpc",
                      headers={"authorization": Secret.from_file(str(good), prefix="Bearer ")})
    os.mkdir(analysis.marks)
    output = _run(processor.DaskExecutor(client=dask_client, status=False, retries=0), fileset,
                  analysis)
    assert output["jets"] > 0


def test_the_demo_against_a_server_that_is_not_there_says_so_in_a_few_lines(tmp_path: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "coffea_sonic.cli", "demo", "--server",
         f"triton+grpc://127.0.0.1:{free_port()}", "--events", "200", "-o", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    error = result.stderr[result.stderr.index("coffea-sonic demo: error:"):]
    assert len(error.strip().splitlines()) <= 5, error
    assert "jet_tagger" in error and "what to do:" in error and "coffea-sonic serve" in error


def test_an_optional_model_the_server_lacks_only_warns_and_the_run_completes(
        dask_client: Any, fileset: dict[str, Any], jet_tagger_server: LocalTritonServer,
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    analysis = Tagger(jet_tagger_server.url("jet_tagger"), str(tmp_path))
    analysis.sonic_configure({"jet_tagger": jet_tagger_server.url("jet_tagger"),
                              "particlenet_lite": jet_tagger_server.url("particlenet_lite")})
    required = _refused(_executor("dask", dask_client), fileset, analysis)
    assert "particlenet_lite" in required
    analysis.sonic_optional = frozenset({"particlenet_lite"})
    with caplog.at_level("WARNING", logger="coffea_sonic.preflight"):
        output = _run(processor.DaskExecutor(client=dask_client, status=False, retries=0),
                      fileset, analysis)
    assert output["jets"] > 0 and len(os.listdir(tmp_path)) == 16
    assert any("optional model 'particlenet_lite'" in r.getMessage() for r in caplog.records)
