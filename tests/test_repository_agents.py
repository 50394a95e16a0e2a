"""Experiments' repositories with checksum repository agents, served by the embedded server.

The repository (tests/experiment_repository.py) is in the official container's format: every config
has a checksum agent, label files, a graph optimisation level, max_batch_size 160-500. It serves
as it is (the digests verified first, the user's files untouched) and answers like onnxruntime /
torch in-process for batches above max_batch_size, and Triton's classification extension answers
the label file's top-K labels; a corrupted model file is refused before
anything starts, naming model, file and both digests; ``models validate`` flags it too.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

torch = pytest.importorskip("torch")
onnxruntime = pytest.importorskip("onnxruntime")

from coffea_sonic import TritonModel  # noqa: E402
from coffea_sonic.errors import UnservableModelError  # noqa: E402
from coffea_sonic.server import LocalTritonServer  # noqa: E402
from coffea_sonic.server.model_check import validate_repository  # noqa: E402
from coffea_sonic.server.model_files import add_model  # noqa: E402
from coffea_sonic.server.standard import plan_repository  # noqa: E402
from experiment_repository import LABELS, experiment_repository, md5, particle_inputs  # noqa: E402


def _top_labels(client, inputs: dict, count: int) -> list[list[str]]:
    """The label file's top-``count`` labels of 3 rows, asked with ``class_count``."""
    tensors = []
    for name, key in (("pf_points", "points"), ("pf_features", "features")):
        tensor = grpcclient.InferInput(name, list(inputs[key][:3].shape), "FP32")
        tensor.set_data_from_numpy(inputs[key][:3])
        tensors.append(tensor)
    answer = client.infer("pnet_onnx", tensors, outputs=[
        grpcclient.InferRequestedOutput("softmax", class_count=count)])
    return [[value.decode() for value in row] for row in answer.as_numpy("softmax")]


def fingerprint(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    return experiment_repository(tmp_path_factory.mktemp("experiment") / "models")


def test_repository_with_checksum_agents_serves_as_it_is_and_answers_like_in_process(repository):
    before = fingerprint(repository)
    inputs = particle_inputs(1200, seed=3)  # above every max_batch_size
    features = np.random.default_rng(4).normal(size=(700, 6)).astype(np.float32)
    session = onnxruntime.InferenceSession(str(repository / "pnet_onnx" / "1" / "model.onnx"))
    expected = session.run(None, {"pf_points": inputs["points"], "pf_features": inputs["features"]})[0]
    with warnings.catch_warnings():  # torch.jit is deprecated, but it is what Triton serves
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(repository / "pnet_ts" / "1" / "model.pt"))
    with torch.no_grad():
        expected_ts = module(torch.from_numpy(inputs["points"]),
                             torch.from_numpy(inputs["features"])).numpy()
    mass = onnxruntime.InferenceSession(str(repository / "mass_reg" / "1" / "model.onnx"))
    with LocalTritonServer(repository=repository, device="cpu").start() as server:
        served = {}
        for name, feed in (("pnet_onnx", {"pf_points": inputs["points"],
                                          "pf_features": inputs["features"]}),
                           ("pnet_ts", {"INPUT__0": inputs["points"], "INPUT__1": inputs["features"]}),
                           ("mass_reg", {"features": features})):
            model = TritonModel(server.url(name), fallback="off")
            try:
                served[name] = model(feed)
            finally:
                model.close()
        client = grpcclient.InferenceServerClient(server.grpc_address)
        mirrored = client.get_model_config("pnet_onnx", as_json=True)["config"]
        classified = _top_labels(client, inputs, 2)  # Triton's classification extension
    np.testing.assert_allclose(served["pnet_onnx"]["softmax"], expected, atol=1.5e-5)
    np.testing.assert_allclose(served["pnet_ts"]["OUTPUT__0"], expected_ts, atol=1.5e-5)
    np.testing.assert_allclose(served["mass_reg"]["mass"],
                               mass.run(None, {"features": features})[0], atol=1.5e-5)
    assert "model_repository_agents" not in mirrored
    best = np.argsort(-expected[:3], axis=1)[:, :2]
    assert [[entry.split(":", 2)[2] for entry in row] for row in classified] == \
        [[LABELS[i] for i in row] for row in best]
    assert mirrored["output"][0]["label_filename"] == "labels.txt"
    assert fingerprint(repository) == before


def test_corrupted_model_file_is_refused_with_its_digests_before_anything_starts(repository, tmp_path):
    corrupted = tmp_path / "models"
    shutil.copytree(repository, corrupted)
    path = corrupted / "pnet_ts" / "1" / "model.pt"
    expected = md5(path)
    path.write_bytes(path.read_bytes() + b"\0")
    server = LocalTritonServer(repository=corrupted, device="cpu")
    with pytest.raises(UnservableModelError) as refused:
        server.start()
    message = str(refused.value)
    for text in ("'pnet_ts'", "MD5 of 1/model.pt", f"expected {expected}", f"found {md5(path)}"):
        assert text in message, text
    assert [r.model for r in refused.value.refusals] == ["pnet_ts"]
    assert server.process is None


def test_validate_checks_digests_and_lists_agents_it_cannot_honour(repository, tmp_path):
    assert validate_repository(repository).problems == []
    broken = tmp_path / "models"
    shutil.copytree(repository, broken)
    (broken / "mass_reg" / "1" / "model.onnx").write_bytes(b"not the model")
    config = broken / "pnet_onnx" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "checksum"', 'name: "relocation"'))
    sha = broken / "pnet_ts" / "config.pbtxt"
    sha.write_text(sha.read_text().replace('"MD5:', '"SHA256:'))
    described = [p.describe() for p in validate_repository(broken).problems]
    assert any("mass_reg" in d and "MD5 of 1/model.onnx" in d and md5(
        broken / "mass_reg" / "1" / "model.onnx") in d for d in described), described
    assert any("pnet_onnx" in d and "'relocation'" in d and "embedded server" in d
               for d in described), described
    assert any("pnet_ts" in d and "SHA256" in d and "MD5" in d for d in described), described
    official = [p.describe() for p in validate_repository(broken, embedded=False).problems]
    assert not any("relocation" in d for d in official)  # the official container may have it


def test_models_add_writes_a_checksum_block_that_serve_verifies(repository, tmp_path):
    added = add_model(repository / "mass_reg" / "1" / "model.onnx", "mass", tmp_path / "repo",
                      max_batch_size=160, checksum=True)
    agent = added.config.model_repository_agents.agents[0]
    assert agent.name == "checksum"
    assert dict(agent.parameters) == {"MD5:1/model.onnx": md5(added.model_path)}
    servable, refusals = plan_repository(tmp_path / "repo")
    assert refusals == [] and not servable[0].config.model_repository_agents.agents
    added.model_path.write_bytes(b"swapped")
    assert "MD5 of 1/model.onnx" in plan_repository(tmp_path / "repo")[1][0].reason


def test_models_validate_command_names_the_mismatch(repository, tmp_path):
    broken = tmp_path / "models"
    shutil.copytree(repository, broken)
    (broken / "pnet_onnx" / "1" / "model.onnx").write_bytes(b"x")
    done = subprocess.run([sys.executable, "-m", "coffea_sonic.cli", "models", "validate",
                           str(broken)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "pnet_onnx: " in done.stdout and "checksum agent: MD5 of 1/model.onnx" in done.stdout
