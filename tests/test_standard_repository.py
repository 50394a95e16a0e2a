"""A repository written for NVIDIA's official Triton container, served by the embedded server.

Real tritonserver, real torch (TorchScript) and onnxruntime: a ParticleNet-style TorchScript model
with ``max_batch_size: 0`` and dims ``[-1, C, -1]`` in two versions (``INPUT__0`` names), the same
kind of model with named inputs and a GPU instance group, an ONNX model with a dynamic batcher, a
python model and an ensemble. coffea's ``triton_wrapper`` and ``TritonModel`` must get what torch /
onnxruntime give in-process, and the user's files must be byte-identical afterwards. Unservable
models are refused before anything starts; ``skip_unservable`` serves the others.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from coffea_sonic import TritonModel
from coffea_sonic.errors import ConfigurationError, UnservableModelError
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.server.standard import plan_repository
from helpers import wait_for

torch = pytest.importorskip("torch")
onnxruntime = pytest.importorskip("onnxruntime")

CHANNELS = 4


class EdgeConvLite(torch.nn.Module):
    """ParticleNet-like: points [N, 2, P] and features [N, C, P] -> class scores [N, 2]."""

    def __init__(self, channels: int = CHANNELS, hidden: int = 8) -> None:
        super().__init__()
        self.point = torch.nn.Conv1d(2 + channels, hidden, 1)
        self.edge = torch.nn.Conv1d(2 * hidden, hidden, 1)
        self.head = torch.nn.Linear(hidden, 2)

    def forward(self, points: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.point(torch.cat([points, features], 1)))
        centre = x.mean(dim=2, keepdim=True).expand_as(x)
        x = torch.relu(self.edge(torch.cat([x, x - centre], 1)))
        return torch.softmax(self.head(x.mean(2)), dim=1)


def _torchscript(path: Path, seed: int) -> None:
    torch.manual_seed(seed)
    with warnings.catch_warnings():  # torch.jit is deprecated, but it is what Triton serves
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(EdgeConvLite().eval()).save(str(path))


def _onnx(path: Path) -> None:
    torch.manual_seed(7)

    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(),
                                           torch.nn.Linear(16, 3))

        def forward(self, features):
            logits = self.mlp(features)
            return logits, torch.softmax(logits, dim=1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Tagger().eval(), (torch.zeros(2, 6),), str(path), dynamo=False,
                          input_names=["features"], output_names=["logits", "probs"],
                          dynamic_axes={"features": {0: "n"}, "logits": {0: "n"}, "probs": {0: "n"}})


PN_INDEXED = """platform: "pytorch_libtorch"
max_batch_size: 0
version_policy { all { } }
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1, 2, -1 ] },
        { name: "INPUT__1" data_type: TYPE_FP32 dims: [ -1, 4, -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
PN_NAMED = """name: "pn_named"
backend: "pytorch"
max_batch_size: 0
input [ { name: "features" data_type: TYPE_FP32 dims: [ -1, 4, -1 ] },
        { name: "points" data_type: TYPE_FP32 dims: [ -1, 2, -1 ] } ]
output [ { name: "scores" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]
instance_group [ { kind: KIND_GPU count: 1 } ]
parameters { key: "DISABLE_OPTIMIZED_EXECUTION" value { string_value: "true" } }
"""
TAGGER = """name: "tagger"
platform: "onnxruntime_onnx"
max_batch_size: 16
default_model_filename: "tagger.onnx"
input [ { name: "features" data_type: TYPE_FP32 dims: [ 6 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "probs" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 50000
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { max_queue_size: 64 }
}
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "owner" value { string_value: "physicist" } }
"""
ECHO = """backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
ECHO_PY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)])
            for r in requests]
"""
ENSEMBLE = """platform: "ensemble"
max_batch_size: 16
input [ { name: "jets" data_type: TYPE_FP32 dims: [ 6 ] } ]
output [ { name: "scores" data_type: TYPE_FP32 dims: [ 3 ] } ]
ensemble_scheduling { step [ { model_name: "tagger" model_version: -1
  input_map { key: "features" value: "jets" } output_map { key: "probs" value: "scores" } } ] }
"""


def _write(path: Path, text: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if text is not None:
        path.write_text(text)
    return path


def official_repository(root: Path) -> Path:
    """The repository a physicist would hand to the official container."""
    _torchscript(_write(root / "pn_indexed" / "1" / "model.pt"), seed=1)
    _torchscript(_write(root / "pn_indexed" / "2" / "model.pt"), seed=2)
    _write(root / "pn_indexed" / "config.pbtxt", PN_INDEXED)
    _torchscript(_write(root / "pn_named" / "1" / "model.pt"), seed=3)
    _write(root / "pn_named" / "config.pbtxt", PN_NAMED)
    _onnx(_write(root / "tagger" / "1" / "tagger.onnx"))
    _write(root / "tagger" / "config.pbtxt", TAGGER)
    _write(root / "echo" / "1" / "model.py", ECHO_PY)
    _write(root / "echo" / "config.pbtxt", ECHO)
    (root / "tagger_ensemble" / "1").mkdir(parents=True)
    _write(root / "tagger_ensemble" / "config.pbtxt", ENSEMBLE)
    return root


def _session_members(pid: int) -> list[int]:
    """PIDs of live processes in session ``pid`` (the server and its python-backend stubs); a
    zombie (killed, not yet reaped by init) holds nothing and is not counted."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def fingerprint(root: Path) -> dict[str, str]:
    """Every file and folder under ``root``: sha256 of files, "dir" for folders."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "dir" for p in sorted(root.rglob("*"))}


def particle_inputs(events: int, particles: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"points": rng.normal(size=(events, 2, particles)).astype(np.float32),
            "features": rng.normal(size=(events, CHANNELS, particles)).astype(np.float32)}


def torch_reference(path: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(path)).eval()
    with torch.no_grad():
        return module(torch.from_numpy(inputs["points"]), torch.from_numpy(inputs["features"])).numpy()


def coffea_wrapper(address: str, model: str, version: int, batch_size: int = -1):
    from coffea.ml_tools.triton_wrapper import triton_wrapper

    class Wrapper(triton_wrapper):
        def prepare_awkward(self, *args, **kwargs):
            raise NotImplementedError("these tests call numpy_call")

    return Wrapper(f"triton+grpc://{address}/{model}/{version}", client_args={"ssl": False},
                   batch_size=batch_size)


def served_by_tritonmodel(url: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    model = TritonModel(url, fallback="off")
    try:
        return model(inputs)
    finally:
        model.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repository = official_repository(tmp_path_factory.mktemp("official") / "models")
    before = fingerprint(repository)
    server = LocalTritonServer(repository=repository, device="cpu").start()
    try:
        yield repository, before, server
    finally:
        server.stop()


def _served_config(client, name: str) -> model_config_pb2.ModelConfig:
    answer = client.get_model_config(name, as_json=True)["config"]
    return json_format.ParseDict(answer, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)


def test_every_model_looks_to_clients_like_the_original(served):
    repository, _, server = served
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        for name in ("pn_indexed", "pn_named", "tagger", "echo", "tagger_ensemble"):
            original = text_format.Parse((repository / name / "config.pbtxt").read_text(),
                                         model_config_pb2.ModelConfig())
            config = _served_config(client, name)
            assert config.name == name
            for field in ("platform", "max_batch_size", "input", "output", "dynamic_batching",
                          "default_model_filename", "parameters", "ensemble_scheduling"):
                if original.HasField(field) if field in ("dynamic_batching", "ensemble_scheduling") \
                        else getattr(original, field):
                    assert getattr(config, field) == getattr(original, field), (name, field)
            counts = [(g.count, g.kind) for g in config.instance_group]
            if name in ("pn_indexed", "tagger"):
                assert counts == [(1, model_config_pb2.ModelInstanceGroup.KIND_CPU)]
            if name == "pn_named":  # KIND_GPU, served on the CPU here (device="cpu")
                assert counts == [(1, model_config_pb2.ModelInstanceGroup.KIND_CPU)]
        metadata = client.get_model_metadata("pn_indexed", as_json=True)
        assert metadata["versions"] == ["1", "2"] and metadata["platform"] == "pytorch_libtorch"
        assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
            ("INPUT__0", "FP32", ["-1", "2", "-1"]), ("INPUT__1", "FP32", ["-1", "4", "-1"])]
        tagger = client.get_model_metadata("tagger", as_json=True)
        assert tagger["platform"] == "onnxruntime_onnx"
        assert [(t["name"], t["shape"]) for t in tagger["outputs"]] == [
            ("logits", ["-1", "3"]), ("probs", ["-1", "3"])]
    finally:
        client.close()


def test_torchscript_versions_answer_like_torch_in_process(served):
    repository, _, server = served
    inputs = particle_inputs(5, 7, seed=11)
    indexed = {"INPUT__0": inputs["points"], "INPUT__1": inputs["features"]}
    results = {}
    for version in (1, 2):
        expected = torch_reference(repository / "pn_indexed" / str(version) / "model.pt", inputs)
        url = server.url("pn_indexed", version)
        ours = served_by_tritonmodel(url, indexed)["OUTPUT__0"]
        coffea = coffea_wrapper(server.grpc_address, "pn_indexed", version,
                                batch_size=5).numpy_call(["OUTPUT__0"], indexed)["OUTPUT__0"]
        for answer in (ours, coffea):
            assert answer.shape == expected.shape == (5, 2)
            assert np.max(np.abs(answer - expected)) <= 1e-5, version
        results[version] = ours
    assert np.max(np.abs(results[1] - results[2])) > 1e-3  # each version loads its own file
    expected = torch_reference(repository / "pn_named" / "1" / "model.pt", inputs)
    named = served_by_tritonmodel(server.url("pn_named"), inputs)["scores"]
    assert np.max(np.abs(named - expected)) <= 1e-5


def test_onnx_model_answers_like_onnxruntime_and_batches_requests(served):
    repository, _, server = served
    session = onnxruntime.InferenceSession(str(repository / "tagger" / "1" / "tagger.onnx"),
                                           providers=["CPUExecutionProvider"])
    rows = np.random.default_rng(3).normal(size=(37, 6)).astype(np.float32)
    logits, probs = session.run(["logits", "probs"], {"features": rows})
    ours = served_by_tritonmodel(server.url("tagger"), {"features": rows})
    coffea = coffea_wrapper(server.grpc_address, "tagger", 1).numpy_call(
        ["probs"], {"features": rows})
    assert np.max(np.abs(ours["logits"] - logits)) <= 1e-5
    for answer in (ours["probs"], coffea["probs"]):
        assert np.max(np.abs(answer - probs)) <= 1e-5
    via_ensemble = served_by_tritonmodel(server.url("tagger_ensemble"), {"jets": rows})
    assert np.max(np.abs(via_ensemble["scores"] - probs)) <= 1e-5

    # requests in flight together are batched by Triton and split back by the adapter
    client = grpcclient.InferenceServerClient(server.grpc_address)
    before = client.get_inference_statistics("tagger", as_json=True)["model_stats"][0]
    answers: dict[int, np.ndarray] = {}

    def infer(start: int, count: int) -> None:
        request = grpcclient.InferInput("features", [count, 6], "FP32")
        request.set_data_from_numpy(rows[start:start + count])
        client.async_infer("tagger", [request], lambda result, error: answers.__setitem__(
            start, error or result.as_numpy("probs")),
            outputs=[grpcclient.InferRequestedOutput("probs")])

    pieces = [(0, 1), (1, 3), (4, 5), (9, 2), (11, 4)]
    for start, count in pieces:
        infer(start, count)
    wait_for(lambda: len(answers) == len(pieces), 60, "answers to 5 requests in flight")
    for start, count in pieces:
        assert np.max(np.abs(answers[start] - probs[start:start + count])) <= 1e-5
    after = client.get_inference_statistics("tagger", as_json=True)["model_stats"][0]
    requests = int(after["inference_stats"]["success"]["count"]) - int(
        before["inference_stats"]["success"]["count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert requests == len(pieces) and executions < requests  # some were run as one batch
    client.close()


def test_python_model_served_as_it_is_and_the_repository_stays_byte_identical(served):
    repository, before, server = served
    answer = served_by_tritonmodel(server.url("echo"), {"x": np.arange(4, dtype=np.float32)})
    assert answer["y"].tolist() == [0.0, 2.0, 4.0, 6.0]
    pid = server.pid
    server.stop()
    assert not server.running
    assert not _session_members(pid)  # stop() returns once its stubs are gone too
    assert fingerprint(repository) == before  # no __pycache__, no file touched


def _unservable_repository(root: Path) -> Path:
    _onnx(_write(root / "good" / "1" / "model.onnx"))  # no config: completed from the graph
    _write(root / "engine" / "config.pbtxt", 'platform: "tensorrt_plan"\nmax_batch_size: 8')
    _write(root / "engine" / "1" / "model.plan", "not really a plan")
    _write(root / "two" / "config.pbtxt", TAGGER.replace('"tagger"', '"two"').replace(
        "max_batch_size: 16", "max_batch_size: 16\nversion_policy { all { } }"))
    _onnx(_write(root / "two" / "1" / "tagger.onnx"))
    (root / "two" / "2").mkdir()  # version 2 lacks its file
    return root


def test_unservable_model_is_refused_before_anything_starts(tmp_path):
    repository = _unservable_repository(tmp_path / "models")
    before = fingerprint(repository)
    server = LocalTritonServer(repository=repository, device="cpu")
    with pytest.raises(UnservableModelError) as refused:
        server.start()
    message = str(refused.value)
    assert isinstance(refused.value, ConfigurationError)
    for text in ("'engine' every version", "tensorrt_plan", "'two' version 2", "tagger.onnx",
                 "official Triton container", f"coffea-sonic models validate {repository}",
                 "skip_unservable=True"):
        assert text in message, text
    assert [(r[0], r[1]) for r in refused.value.refusals] == [("engine", None), ("two", 2)]
    assert server.process is None and not server.running
    assert fingerprint(repository) == before


def test_skip_unservable_serves_the_others(tmp_path):
    repository = _unservable_repository(tmp_path / "models")
    before = fingerprint(repository)
    with LocalTritonServer(repository=repository, device="cpu", skip_unservable=True) as server:
        assert [(model, version) for model, version, _ in server.skipped] == [
            ("engine", None), ("two", 2)]
        assert "tensorrt_plan" in server.skipped[0][2]
        client = grpcclient.InferenceServerClient(server.grpc_address)
        assert not client.is_model_ready("engine")
        assert client.get_model_metadata("two", as_json=True)["versions"] == ["1"]
        good = client.get_model_config("good", as_json=True)["config"]
        assert good["max_batch_size"] == 4 and "dynamic_batching" in good
        client.close()
        rows = np.ones((3, 6), np.float32)
        for name in ("good", "two"):
            assert served_by_tritonmodel(server.url(name), {"features": rows})["probs"].shape == (3, 3)
    assert fingerprint(repository) == before


@pytest.mark.parametrize("config, files, reason", [
    ('platform: "tensorflow_savedmodel"', ["1/model.savedmodel/saved_model.pb"], "tensorflow"),
    ('backend: "dali"', ["1/model.dali"], "custom backend"),
    (None, ["1/model.pt"], "no config.pbtxt"),
    ('name: "other"\nbackend: "python"', ["1/model.py"], "Triton needs them equal"),
    ('platform: "onnxruntime_onnx"', [], "no version folder"),
    ('platform: "onnxruntime_onnx"\nversion_policy { specific { versions: [3] } }', ["1/model.onnx"],
     "version 3, which has no folder"),
    ('max_batch_sise: 4', [], "not a valid Triton model config"),
])
def test_plan_refuses_with_the_reason(tmp_path, config, files, reason):
    model = tmp_path / "m"
    model.mkdir()
    if config is not None:
        (model / "config.pbtxt").write_text(config)
    for file in files:
        _write(model / file, "x")
    servable, refusals = plan_repository(tmp_path)
    assert servable == [] and len(refusals) == 1 and reason in refusals[0].reason, refusals


def test_torchscript_refused_when_torch_is_not_importable(tmp_path, monkeypatch):
    _write(tmp_path / "pn" / "config.pbtxt", PN_INDEXED)
    _write(tmp_path / "pn" / "1" / "model.pt", "x")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    servable, refusals = plan_repository(tmp_path)
    assert not servable and "pip install 'coffea-sonic[torch]'" in refusals[0].reason
    assert "pytorch_libtorch" in refusals[0].reason
    json.dumps(refusals)  # plain data: the CLI may print or serialise it


def test_local_fallback_serves_a_model_of_the_fallback_repository(tmp_path, monkeypatch):
    from coffea_sonic import fallback as fallback_module
    from coffea_sonic.server import fallback as local_fallback
    from coffea_sonic.server import free_port

    repository = _unservable_repository(tmp_path / "models")
    monkeypatch.setenv("COFFEA_SONIC_FALLBACK_REPOSITORY", str(repository))
    rows = np.random.default_rng(5).normal(size=(9, 6)).astype(np.float32)
    expected = onnxruntime.InferenceSession(str(repository / "good" / "1" / "model.onnx"),
                                            providers=["CPUExecutionProvider"]).run(
        ["probs"], {"features": rows})[0]
    dead = f"triton+grpc://127.0.0.1:{free_port()}/good"
    model = TritonModel(dead, fallback="local", connect_timeout_s=1)
    try:
        answer = model({"features": rows})["probs"]  # model info from the local server, too
        assert np.max(np.abs(answer - expected)) <= 1e-5
        assert model.stats.fallback_rows == 9
    finally:
        model.close()
        fallback_module._engines.pop(("local", "good"), None)
        for server in local_fallback._servers.values():
            server.stop()
        local_fallback._servers.clear()


@pytest.mark.gpu
def test_gpu_server_runs_the_repository_on_gpu_instances_within_1e4_of_cpu(tmp_path):
    from coffea_sonic.server.launcher import gpu_available

    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    repository = official_repository(tmp_path / "models")
    before = fingerprint(repository)
    inputs = particle_inputs(events=3, particles=17, seed=7)
    indexed = {"INPUT__0": inputs["points"], "INPUT__1": inputs["features"]}
    rows = np.random.default_rng(3).normal(size=(100, 6)).astype(np.float32)
    session = onnxruntime.InferenceSession(str(repository / "tagger" / "1" / "tagger.onnx"),
                                           providers=["CPUExecutionProvider"])
    with LocalTritonServer(repository=repository, device="gpu") as server:
        log = server.log_path.read_text(errors="replace")
        assert "(GPU device 0)" in log, log[-3000:]
        expected = torch_reference(repository / "pn_indexed" / "2" / "model.pt", inputs)
        ours = served_by_tritonmodel(server.url("pn_indexed", 2), indexed)["OUTPUT__0"]
        assert np.max(np.abs(ours - expected)) <= 1e-4
        expected = torch_reference(repository / "pn_named" / "1" / "model.pt", inputs)
        ours = served_by_tritonmodel(server.url("pn_named"), inputs)["scores"]
        assert np.max(np.abs(ours - expected)) <= 1e-4
        probs = session.run(["probs"], {"features": rows})[0]
        ours = served_by_tritonmodel(server.url("tagger"), {"features": rows})["probs"]
        assert np.max(np.abs(ours - probs)) <= 1e-4
    assert fingerprint(repository) == before


def test_an_onnx_config_that_contradicts_its_graph_is_refused_like_the_official_container(tmp_path):
    _onnx(_write(tmp_path / "tagger" / "1" / "tagger.onnx"))
    _write(tmp_path / "tagger" / "config.pbtxt", TAGGER.replace("dims: [ 6 ]", "dims: [ 7 ]"))
    servable, refusals = plan_repository(tmp_path)
    assert servable == [] and len(refusals) == 1, refusals
    assert "contradicts the ONNX graph" in refusals[0].reason
    assert "input 'features' dims" in refusals[0].reason
