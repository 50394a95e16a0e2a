"""``coffea-sonic models add | validate`` and ``serve --repository [--skip-unservable]``, as a user runs them.

A model file goes into a repository with ``models add``; the written configs parse with Triton's
own ``model_config_pb2`` and name every tensor; ``serve --repository`` (a real tritonserver, its
python-backend adapters) answers like the framework in-process; ``models validate`` lists every
problem of a broken repository in one run.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper, save
from tritonclient.grpc import model_config_pb2

from coffea_sonic.cli import main
from coffea_sonic.server.model_check import validate_repository
from helpers import stop_gracefully, wait_for

ROWS = np.random.default_rng(7).normal(size=(300, 6)).astype(np.float32)
SCALE = np.random.default_rng(8).uniform(0.5, 2.0, size=(300, 1)).astype(np.float32)
WEIGHTS = np.random.default_rng(9).normal(size=(6, 3)).astype(np.float32)
BIAS = np.array([0.1, -0.2, 0.3], dtype=np.float32)


def write_onnx(path: Path, batch: str | int = "batch") -> Path:
    """features [N,6], scale [N,1] -> logits = (features @ W + b) * scale, probs = softmax(logits)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "W"], ["mm"]),
         helper.make_node("Add", ["mm", "b"], ["affine"]),
         helper.make_node("Mul", ["affine", "scale"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)],
        "tagger",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [batch, 6]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [batch, 1])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 3]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 3])],
        [numpy_helper.from_array(WEIGHTS, "W"), numpy_helper.from_array(BIAS, "b")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def write_torchscript(path: Path) -> Path:
    """The same computation as :func:`write_onnx`, traced: forward(features, scale) -> (probs, logits)."""
    torch = pytest.importorskip("torch")

    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(6, 3)
            with torch.no_grad():
                self.linear.weight.copy_(torch.from_numpy(WEIGHTS.T.copy()))
                self.linear.bias.copy_(torch.from_numpy(BIAS))

        def forward(self, features, scale):
            logits = self.linear(features) * scale
            return torch.softmax(logits, dim=-1), logits

    example = (torch.zeros(2, 6), torch.ones(2, 1))
    torch.jit.trace(Tagger().eval(), example).save(str(path))
    return path


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``coffea-sonic ARGS`` in this process: (exit code, stdout, stderr)."""
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@contextlib.contextmanager
def serving(repository: Path, *extra: str) -> Iterator[tuple[subprocess.Popen, list[str]]]:
    """``coffea-sonic serve --repository`` on free ports until it printed that it is ready (or exited)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "coffea_sonic.cli", "serve", "--repository", str(repository),
         "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0", "--device", "cpu", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read() -> None:
        for line in process.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: process.poll() is not None or any("Press Ctrl-C" in l for l in lines),
                 180, lambda: f"serve to become ready; output so far:\n{''.join(lines)}")
        if process.poll() is not None:
            reader.join(10)
        yield process, lines
    finally:
        stop_gracefully(process)
        reader.join(10)


def served_urls(lines: list[str]) -> dict[str, str]:
    """{model: url} from serve's ``  model    triton+grpc://...`` lines."""
    return {url.rsplit("/", 1)[1]: url for url in
            (line.split()[1] for line in lines if line.startswith("  model "))}


def test_models_add_writes_configs_that_parse_and_name_every_tensor(tmp_path, capsys):
    repository = tmp_path / "repo"
    code, out, err = cli(capsys, "models", "add", write_onnx(tmp_path / "tagger.onnx"),
                         "--name", "tagger_onnx", "-o", repository,
                         "--preferred-batch-size", "64", "256", "--instances", "2")
    assert code == 0, err
    assert "max_batch_size 1024" in out and "models validate" in out
    config = read_config(repository / "tagger_onnx" / "config.pbtxt")
    assert (config.name, config.platform, config.max_batch_size) == (
        "tagger_onnx", "onnxruntime_onnx", 1024)
    assert [(t.name, list(t.dims)) for t in config.input] == [("features", [6]), ("scale", [1])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("probs", [3]), ("logits", [3])]
    assert {t.data_type for t in (*config.input, *config.output)} == {model_config_pb2.TYPE_FP32}
    assert list(config.dynamic_batching.preferred_batch_size) == [64, 256]
    assert (config.instance_group[0].kind, config.instance_group[0].count) == (
        model_config_pb2.ModelInstanceGroup.KIND_CPU, 2)
    assert (repository / "tagger_onnx" / "1" / "model.onnx").is_file()

    code, out, err = cli(capsys, "models", "add", write_torchscript(tmp_path / "tagger.pt"),
                         "--name", "tagger_ts", "-o", repository, "--max-batch-size",
                         "512", "--input", "features:FP32:6", "--input", "scale:FP32:1",
                         "--output-tensor", "OUTPUT__0:FP32:3", "--output-tensor", "OUTPUT__1:FP32:3",
                         "--device", "gpu")
    assert code == 0, err
    config = read_config(repository / "tagger_ts" / "config.pbtxt")
    assert (config.platform, config.max_batch_size) == ("pytorch_libtorch", 512)
    assert [t.name for t in config.input] == ["features", "scale"]
    assert [t.name for t in config.output] == ["OUTPUT__0", "OUTPUT__1"]
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert (repository / "tagger_ts" / "1" / "model.pt").is_file()

    code, out, err = cli(capsys, "models", "validate", repository)
    assert code == 0, out + err
    assert "tagger_onnx: ok" in out and "tagger_ts: ok" in out


def test_example_input_traces_a_torchscript_signature(tmp_path, capsys):
    model = write_torchscript(tmp_path / "tagger.pt")
    np.savez(tmp_path / "example.npz", features=ROWS[:5], scale=SCALE[:5])
    code, out, err = cli(capsys, "models", "add", model, "--name", "traced", "-o",
                         tmp_path / "repo", "--max-batch-size", "128",
                         "--example-input", tmp_path / "example.npz")
    assert code == 0, err
    config = read_config(tmp_path / "repo" / "traced" / "config.pbtxt")
    assert [(t.name, list(t.dims)) for t in config.input] == [("features", [6]), ("scale", [1])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("OUTPUT__0", [3]), ("OUTPUT__1", [3])]


def test_models_add_then_serve_answers_like_the_frameworks_in_process(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    import onnxruntime

    from coffea_sonic import TritonModel

    repository = tmp_path / "repo"
    onnx_file, torch_file = write_onnx(tmp_path / "tagger.onnx"), write_torchscript(tmp_path / "t.pt")
    assert cli(capsys, "models", "add", onnx_file, "--name", "tagger_onnx", "-o",
               repository, "--preferred-batch-size", "64")[0] == 0
    assert cli(capsys, "models", "add", torch_file, "--name", "tagger_ts", "-o",
               repository, "--max-batch-size", "128", "--input", "features:FP32:6", "--input",
               "scale:FP32:1", "--output-tensor", "OUTPUT__0:FP32:3", "--output-tensor", "OUTPUT__1:FP32:3")[0] == 0
    before = {p: p.read_bytes() for p in repository.rglob("*") if p.is_file()}

    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    expected_probs, expected_logits = session.run(None, {"features": ROWS, "scale": SCALE})
    with torch.no_grad():
        torch_probs, torch_logits = torch.jit.load(str(torch_file))(
            torch.from_numpy(ROWS), torch.from_numpy(SCALE))

    with serving(repository) as (process, lines):
        assert process.poll() is None, "".join(lines)
        urls = served_urls(lines)
        assert set(urls) == {"tagger_onnx", "tagger_ts"}, "".join(lines)
        models = [TritonModel(urls["tagger_onnx"]), TritonModel(urls["tagger_ts"])]
        try:
            onnx_out = models[0]({"features": ROWS, "scale": SCALE})
            torch_out = models[1]({"features": ROWS, "scale": SCALE})
        finally:
            for model in models:
                model.close()
    np.testing.assert_allclose(onnx_out["probs"], expected_probs, atol=1e-5)
    np.testing.assert_allclose(onnx_out["logits"], expected_logits, atol=1e-5)
    np.testing.assert_allclose(torch_out["OUTPUT__0"], torch_probs.numpy(), atol=1e-5)
    np.testing.assert_allclose(torch_out["OUTPUT__1"], torch_logits.numpy(), atol=1e-5)
    assert process.returncode == 0
    assert {p: p.read_bytes() for p in repository.rglob("*") if p.is_file()} == before


def test_validate_reports_a_wrong_dims_entry_and_a_missing_file_in_one_run(tmp_path, capsys):
    repository = tmp_path / "repo"
    for name in ("first", "second"):
        assert cli(capsys, "models", "add", write_onnx(tmp_path / f"{name}.onnx"), "--name", name,
                   "-o", repository)[0] == 0
    config_path = repository / "first" / "config.pbtxt"
    config = read_config(config_path)
    config.input[0].dims[:] = [7]  # the graph has features [batch, 6]
    config_path.write_text(text_format.MessageToString(config))
    (repository / "second" / "1" / "model.onnx").unlink()

    code, out, err = cli(capsys, "models", "validate", repository)
    assert code == 1, out + err
    assert "first version 1: input 'features' dims: expected [6]" in out and "found [7]" in out
    assert "second version 1: model file: expected 1/model.onnx, found nothing" in out
    assert "2 problem(s)" in out
    problems = validate_repository(repository).problems
    assert {(p.model, p.version, p.what) for p in problems} == {
        ("first", "1", "input 'features' dims"), ("second", "1", "model file")}

    code, out, _ = cli(capsys, "models", "validate", repository, "--json")
    document = json.loads(out)
    assert code == 1 and document["ok"] is False and document["models"] == ["first", "second"]
    assert {(p["model"], p["version"], p["what"]) for p in document["problems"]} == {
        ("first", "1", "input 'features' dims"), ("second", "1", "model file")}
    wrong = next(p for p in document["problems"] if p["model"] == "first")
    assert wrong["expected"].startswith("[6]") and wrong["actual"] == "[7]"


def test_models_list_json_names_every_zoo_tensor(capsys):
    from coffea_sonic import zoo

    code, out, _ = cli(capsys, "models", "list", "--json")
    listed = {entry["name"]: entry for entry in json.loads(out)}
    assert code == 0 and set(zoo.names()) <= set(listed)
    for name in zoo.names():
        spec = zoo.spec(name)
        assert [t["name"] for t in listed[name]["inputs"]] == [t.name for t in spec.inputs]
        assert [t["dims"] for t in listed[name]["outputs"]] == [list(t.dims) for t in spec.outputs]
        assert listed[name]["max_batch_size"] == spec.max_batch_size


def test_torchscript_without_batching_and_a_wrong_output_found_by_running_it(tmp_path, capsys):
    """ParticleNet-style: max_batch_size 0, dims [-1, 2, -1]; validate runs the module when it can."""
    torch = pytest.importorskip("torch")

    class PointNet(torch.nn.Module):
        def forward(self, points):  # [jets, 2, constituents] -> [jets, 3]
            pooled = points.mean(dim=2)
            return torch.cat([pooled, pooled.sum(dim=1, keepdim=True)], dim=1)

    torch.jit.trace(PointNet(), torch.zeros(3, 2, 5)).save(str(tmp_path / "pnet.pt"))
    repository = tmp_path / "repo"
    code, _, err = cli(capsys, "models", "add", tmp_path / "pnet.pt", "--name", "pnet",
                       "-o", repository, "--max-batch-size", "0",
                       "--input", "points:FP32:-1,2,-1", "--output-tensor", "OUTPUT__0:FP32:-1,3")
    assert code == 0, err
    config = read_config(repository / "pnet" / "config.pbtxt")
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [-1, 2, -1]
    assert cli(capsys, "models", "validate", repository)[0] == 0

    # with every dim known, validate runs the module and compares what comes out
    config.input[0].dims[:] = [4, 2, 8]
    config.output[0].dims[:] = [4, 2]
    (repository / "pnet" / "config.pbtxt").write_text(text_format.MessageToString(config))
    code, out, _ = cli(capsys, "models", "validate", repository)
    assert code == 1 and "pnet version 1: output 'OUTPUT__0' dims: expected [4, 3] (from a run), found [4, 2]" in out


def test_models_add_errors_name_the_file_and_what_to_pass(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    repository = tmp_path / "repo"
    fixed = write_onnx(tmp_path / "fixed.onnx", batch=4)
    code, _, err = cli(capsys, "models", "add", fixed, "--name", "m", "-o", repository,
                       "--max-batch-size", "8")
    assert code == 1 and str(fixed) in err and "--max-batch-size 0" in err and "dynamic" in err

    script = write_torchscript(tmp_path / "t.pt")
    code, _, err = cli(capsys, "models", "add", script, "--name", "m", "-o", repository,
                       "--input", "features:FP32:6")
    assert code == 1 and str(script) in err and "--max-batch-size N" in err
    code, _, err = cli(capsys, "models", "add", script, "--name", "m", "-o", repository,
                       "--max-batch-size", "8")
    assert code == 1 and "--input INPUT__0:FP32:6" in err and "--example-input" in err
    code, _, err = cli(capsys, "models", "add", script, "--name", "m", "-o", repository,
                       "--max-batch-size", "8", "--input", "features:FP32:6", "--input",
                       "scale:FP32:1", "--output-tensor", "OUTPUT__0:FP32:4")
    assert code == 1 and "output 'OUTPUT__0' dims: expected [3]" in err

    pickled = tmp_path / "pickled.pt"
    torch.save(torch.nn.Linear(6, 3), pickled)
    code, _, err = cli(capsys, "models", "add", pickled, "--name", "m", "-o", repository,
                       "--max-batch-size", "8", "--input", "x:FP32:6", "--output-tensor", "y:FP32:3")
    assert code == 1 and str(pickled) in err and "torch.jit.trace" in err
    code, _, err = cli(capsys, "models", "add", fixed, "--name", "m", "-o", repository,
                       "--input", "x:FLOAT32:6")
    assert code == 1 and "'FLOAT32' is not a Triton type" in err
    assert not (repository / "m").exists()


def test_serve_refuses_an_unservable_model_and_skip_unservable_serves_the_rest(tmp_path, capsys):
    repository = tmp_path / "repo"
    assert cli(capsys, "models", "add", write_onnx(tmp_path / "t.onnx"), "--name", "tagger",
               "-o", repository)[0] == 0
    (repository / "engine" / "1").mkdir(parents=True)
    (repository / "engine" / "config.pbtxt").write_text(
        'platform: "tensorrt_plan"\nmax_batch_size: 8\n'
        'input { name: "x" data_type: TYPE_FP32 dims: [4] }\n'
        'output { name: "y" data_type: TYPE_FP32 dims: [4] }\n')
    (repository / "engine" / "1" / "model.plan").write_bytes(b"not here")

    with serving(repository) as (process, lines):
        wait_for(lambda: process.poll() is not None, 60, "serve to exit after the refusal")
    assert process.returncode == 1 and "engine" in "".join(lines) and "--skip-unservable" in "".join(lines)

    with serving(repository, "--skip-unservable") as (process, lines):
        assert process.poll() is None, "".join(lines)
        assert any(line.startswith("  skipped  engine") and "tensorrt" in line for line in lines)
        assert set(served_urls(lines)) == {"tagger"}
        from coffea_sonic import TritonModel

        model = TritonModel(served_urls(lines)["tagger"])
        try:
            assert model({"features": ROWS[:3], "scale": SCALE[:3]})["probs"].shape == (3, 3)
        finally:
            model.close()

    code, out, _ = cli(capsys, "models", "validate", repository)
    assert code == 1 and "engine: the embedded server (coffea-sonic serve) cannot run it" in out
    assert cli(capsys, "models", "validate", repository, "--official-only")[0] == 0


@pytest.mark.parametrize("command", [["models", "add"], ["models", "validate"], ["serve"]])
def test_help_teaches_with_examples(capsys, command):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = capsys.readouterr().out
    assert "examples:" in text and f"coffea-sonic {' '.join(command)} " in text


def test_your_model_notebook_runs_end_to_end(tmp_path, monkeypatch):
    """notebooks/03_your_model.ipynb: train, export, models add, validate, serve, TritonModel, SonicMixin."""
    pytest.importorskip("torch")
    from notebook_runner import run_notebook

    for name in ("COFFEA_SONIC_SERVERS", "COFFEA_SONIC_MODEL_TAGGER_ONNX", "COFFEA_SONIC_MODEL_TAGGER_TS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COFFEA_SONIC_CONFIG", str(tmp_path / "no-endpoints.toml"))
    (tmp_path / "no-endpoints.toml").write_text("")
    outputs = run_notebook("03_your_model.ipynb", tmp_path, EVENTS=400, WORKDIR=str(tmp_path))
    assert "tagger_onnx: ok" in outputs and "tagger_ts: ok" in outputs
    assert "max |served TorchScript - torch|" in outputs and "b-tagged jets per event" in outputs
    assert (tmp_path / "repo" / "tagger_ts" / "1" / "model.pt").is_file()
