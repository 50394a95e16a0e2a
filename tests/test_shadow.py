"""Shadow validation on the real path: a fraction of served rows recomputed in-process.

An honest server (the zoo's models) is never flagged; a server whose models were altered the way
wrong conversions alter them (every weight x 1.01, or rounded to fp16; same names, signatures and
versions) is caught: the next call raises, or the server is quarantined and the fallback answers.
The demo (40 000 events, real Dask workers, shadow=0.001) catches an altered server within the
run and leaves an honest one unflagged, over gRPC and over shared memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from coffea_sonic import TritonModel, zoo  # noqa: E402
from coffea_sonic.data.synthetic import write_sample  # noqa: E402
from coffea_sonic.server import LocalTritonServer  # noqa: E402
from coffea_sonic.errors import MissingDependencyError  # noqa: E402
from coffea_sonic.shadow import ShadowDivergenceError, shadow_hook  # noqa: E402
from altered_models import altered_repository  # noqa: E402
from helpers import wait_for  # noqa: E402
from server_side import sent_over  # noqa: E402

MODELS = ["jet_tagger", "particlenet", "deepmet"]


def rows_for(name: str, count: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.normal(size=(count, *[d if d > 0 else 8 for d in t.dims])).astype(t.dtype)
            for t in zoo.spec(name).inputs}


@pytest.fixture(scope="module")
def altered_server(tmp_path_factory):
    repository = altered_repository(tmp_path_factory.mktemp("altered") / "models", MODELS,
                                    "scaled")
    with LocalTritonServer(repository=repository, device="cpu").start() as server:
        yield server


def test_honest_server_is_not_flagged(jet_tagger_server, each_transport):
    model = TritonModel(f"triton+grpc://{jet_tagger_server.grpc_address}/jet_tagger",
                        shadow=0.2, fallback="off")
    try:
        with sent_over(each_transport, jet_tagger_server):
            for seed in range(5):
                model(rows_for("jet_tagger", 3000, seed))
        shadow_hook(model).drain()
        report = shadow_hook(model).report()
    finally:
        model.close()
    assert report[jet_tagger_server.grpc_address]["probs"]["rows"] > 1000
    assert report[jet_tagger_server.grpc_address]["probs"]["largest"] < 1e-6
    assert model.stats.shadow_alarms == 0 and model.stats.shadow_rows > 1000


def test_altered_server_raises_on_the_next_call_naming_server_and_output(altered_server, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("COFFEA_SONIC_SHADOW_DIR", str(tmp_path / "shadow"))
    model = TritonModel(altered_server.url("jet_tagger"), shadow=0.01, fallback="off")
    try:
        model(rows_for("jet_tagger", 3000, 1))
        wait_for(lambda: model.stats.shadow_rows > 0, 60, "a shadow comparison")
        with pytest.raises(ShadowDivergenceError) as caught:
            model(rows_for("jet_tagger", 10, 2))
    finally:
        model.close()
    message = str(caught.value)
    for text in ("'jet_tagger'", altered_server.grpc_address, "output 'probs'", "tolerance 0.0001"):
        assert text in message, (text, message)
    assert model.stats.shadow_alarms >= 1
    shown = subprocess.run([sys.executable, "-m", "coffea_sonic.cli", "monitor", "--shadow",
                            str(tmp_path / "shadow"), "--frames", "1", "--no-color"],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert shown.returncode == 0, shown.stderr
    assert f"jet_tagger at {altered_server.grpc_address} output probs" in shown.stdout, shown.stdout
    assert "alarm(s)" in shown.stdout and "0 alarm(s)" not in shown.stdout, shown.stdout


def test_a_server_whose_models_were_cast_to_fp16_is_caught_at_a_tenth_of_a_percent(
        tmp_path_factory):
    repository = altered_repository(tmp_path_factory.mktemp("fp16") / "models", ["particlenet"],
                                    "fp16")
    with LocalTritonServer(repository=repository, device="cpu").start() as server:
        model = TritonModel(server.url("particlenet"), shadow=0.001, fallback="off")
        try:
            model(zoo.example_inputs("particlenet", 20000, seed=6))  # about 20 rows shadowed
            with pytest.raises(ShadowDivergenceError) as caught:
                shadow_hook(model).drain()
        finally:
            model.close()
    assert server.grpc_address in str(caught.value) and "output 'probs'" in str(caught.value)
    assert 0 < model.stats.shadow_rows < 200 and model.stats.shadow_alarms >= 1


def test_quarantine_moves_the_rows_to_the_fallback(altered_server):
    model = TritonModel(altered_server.url("jet_tagger"), shadow=0.05, fallback="cpu",
                        shadow_action="quarantine")
    try:
        model(rows_for("jet_tagger", 4000, 3))
        shadow_hook(model).drain()
        wait_for(lambda: model(rows_for("jet_tagger", 500, 4)) is not None
                 and model.stats.fallback_rows > 0, 60, "rows answered by the fallback")
    finally:
        model.close()
    assert model.stats.shadow_alarms >= 1


@pytest.fixture(scope="module")
def demo_fileset(tmp_path_factory) -> Path:
    """The demo's 40 000-event sample (two datasets), written once for every demo run here."""
    folder = tmp_path_factory.mktemp("sample")
    fileset = write_sample(folder, events=20000, files=2, seed=0)  # per dataset
    path = folder / "fileset.json"
    path.write_text(json.dumps({name: [str(f) for f in files] for name, files in fileset.items()}))
    return path


def test_a_missing_reference_engine_names_the_extra(jet_tagger_server):
    def no_onnxruntime(model: str):
        raise ImportError("No module named 'onnxruntime'", name="onnxruntime")

    model = TritonModel(f"triton+grpc://{jet_tagger_server.grpc_address}/jet_tagger", shadow=0.5,
                        fallback=no_onnxruntime)
    try:
        model(rows_for("jet_tagger", 200, 5))
        with pytest.raises(MissingDependencyError, match=r"onnxruntime.*coffea-sonic\[onnx\]"):
            shadow_hook(model).drain()
    finally:
        model.close()


def _demo(tmp_path: Path, fileset: Path, name: str, environment: dict[str, str], *extra: str):
    output = tmp_path / name
    completed = subprocess.run(
        [sys.executable, "-m", "coffea_sonic.cli", "demo", "--fileset", str(fileset), "--output",
         str(output), "--device", "cpu", "--no-progress", *extra],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "COFFEA_SONIC_SHADOW": "0.001", **environment,
             "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    return completed, output


@pytest.mark.slow
def test_demo_run_catches_an_altered_server(altered_server, demo_fileset, tmp_path):
    completed, _ = _demo(tmp_path, demo_fileset, "altered", {},
                         "--server", f"triton+grpc://{altered_server.grpc_address}")
    assert completed.returncode != 0, completed.stdout[-2000:]
    assert "ShadowDivergenceError" in completed.stderr and altered_server.grpc_address in \
        completed.stderr, completed.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_demo_run_on_an_honest_server_is_not_flagged(triton_server, demo_fileset, tmp_path,
                                                     transport):
    # the zoo's server, started here so that its side of the run can be checked
    with sent_over(transport, triton_server):
        completed, output = _demo(tmp_path, demo_fileset, transport,
                                  {"COFFEA_SONIC_TRANSPORT": transport},
                                  "--server", f"triton+grpc://{triton_server.grpc_address}")
        assert completed.returncode == 0, completed.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    for name in ("jet_tagger", "particlenet"):
        assert summary["client"][name]["shadow_rows"] > 0, name
        assert summary["client"][name]["shadow_alarms"] == 0, name
    assert "recomputed in-process by shadow validation, 0 over its tolerance" in completed.stdout
