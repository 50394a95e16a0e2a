"""Wrong answers raise ``InferenceError``; TritonModel never hands out misaligned or mistyped data.

A real embedded tritonserver serves a hand-written python-backend model, once per kind of wrong
answer (selected by the config parameter ``mode``): one row too few or too many, a declared output
left out, an output of the wrong dtype (FP16 is a safe cast to the declared FP32 and is accepted;
FP64 and INT32 are not and are refused), an output of the wrong per-row shape, and a row dropped in
only one of several pieces of a call. A custom fallback factory whose engine answers wrongly is
held to the same checks once the server is gone. Every case runs over plain gRPC and over system
shared memory, and the server's own log says which wire its requests came over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pytest

from coffea_sonic import TritonModel
from coffea_sonic.errors import InferenceError
from coffea_sonic.server import LocalTritonServer
from server_side import sent_over

TRANSPORTS = ("grpc", "shm")
#: rows per test call; features are multiples of 1/4 below 16, exact in FP16 as well as FP32
ROWS = 10
FEATURES = 4

#: python-backend model: y = 2 * x[:, :2] (FP32 [2]) and z = row sums of x (FP32 [1]), answered
#: correctly (``good``) or wrongly in the way the config parameter ``mode`` names
MODEL_PY = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.mode = config["parameters"]["mode"]["string_value"]

    def answer(self, x):
        y = (2.0 * x[:, :2]).astype(np.float32)
        z = x.sum(axis=1, keepdims=True).astype(np.float32)
        mode = self.mode
        if mode == "short" or (mode == "short_last_piece" and len(x) == 2):
            return {"y": y[:-1], "z": z[:-1]}
        if mode == "extra":
            return {"y": np.concatenate([y, y[:1]]), "z": np.concatenate([z, z[:1]])}
        if mode == "missing":
            return {"y": y}
        if mode == "fp16":
            return {"y": y.astype(np.float16), "z": z}
        if mode == "fp64":
            return {"y": y.astype(np.float64), "z": z}
        if mode == "int32":
            return {"y": y.astype(np.int32), "z": z}
        if mode == "narrow":
            return {"y": y[:, :1].copy(), "z": z}
        return {"y": y, "z": z}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            outputs = self.answer(x)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, np.ascontiguousarray(array))
                 for name, array in outputs.items()]))
        return responses
'''

CONFIG_PBTXT = '''name: "{name}"
backend: "python"
max_batch_size: 1024
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {features} ] }} ]
output [
  {{ name: "y" data_type: TYPE_FP32 dims: [ 2 ] }},
  {{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "mode" value: {{ string_value: "{mode}" }} }}
'''

#: wrong answers the client must refuse, and a pattern of the message that says why
REFUSED: dict[str, str] = {
    "short": r"shape \[9, 2\] for a request of 10 rows",
    "extra": r"shape \[11, 2\] for a request of 10 rows",
    "missing": r"lacks outputs \['z'\]",
    "fp64": r"'y'.*float64.*declares float32",
    "int32": r"'y'.*int32.*declares float32",
    "narrow": r"'y'",
}
#: over shared memory the client reserves the declared bytes per output: an answer that needs
#: more is refused by the server itself (INTERNAL), which must reach the caller as InferenceError
SHM_OVERFLOW = r"shared memory size specified with the request for output 'y'"
OVERFLOWS_SHM = ("extra", "fp64")
MODES = ("good", "fp16", "short_last_piece", *REFUSED)


def _write_repository(dest: Path) -> Path:
    """One model per mode, ``answer_<mode>``, all from :data:`MODEL_PY`."""
    for mode in MODES:
        name = f"answer_{mode}"
        version_dir = dest / name / "1"
        version_dir.mkdir(parents=True)
        (dest / name / "config.pbtxt").write_text(
            CONFIG_PBTXT.format(name=name, features=FEATURES, mode=mode))
        (version_dir / "model.py").write_text(MODEL_PY)
    return dest


def _inputs(rows: int = ROWS) -> dict[str, np.ndarray]:
    x = (np.arange(rows * FEATURES, dtype=np.float32).reshape(rows, FEATURES) % 64) / 4
    return {"x": x}


def _expected(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    x = inputs["x"]
    return {"y": (2.0 * x[:, :2]).astype(np.float32),
            "z": x.sum(axis=1, keepdims=True).astype(np.float32)}


def _assert_right(outputs: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> None:
    expected = _expected(inputs)
    assert sorted(outputs) == sorted(expected)
    for name, want in expected.items():
        assert outputs[name].dtype == np.float32, name
        assert outputs[name].shape == want.shape, name
        np.testing.assert_array_equal(outputs[name], want, err_msg=name)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    """A real tritonserver serving ``answer_<mode>`` for every mode."""
    repository = _write_repository(tmp_path_factory.mktemp("wrong-answers") / "models")
    with LocalTritonServer(repository=repository, device="cpu") as running:
        yield running


def _model(server: LocalTritonServer, mode: str, transport: str, **options: Any) -> TritonModel:
    return TritonModel(server.url(f"answer_{mode}"), transport=transport, timeout_s=30.0,
                       **options)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_correct_answer_is_returned_as_declared(server: LocalTritonServer, transport: str) -> None:
    model = _model(server, "good", transport)
    inputs = _inputs()
    with sent_over(transport, server) as wire:  # over shm: both outputs written into the region
        _assert_right(model(inputs), inputs)
    assert model.stats.rows == ROWS and model.stats.failed_requests == 0
    assert wire.shm_outputs == (2 if transport == "shm" else 0), wire


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_output_in_a_safely_castable_dtype_is_accepted_as_the_declared_dtype(
        server: LocalTritonServer, transport: str) -> None:
    model = _model(server, "fp16", transport)
    inputs = _inputs()
    with sent_over(transport, server):
        _assert_right(model(inputs), inputs)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mode", sorted(REFUSED))
def test_a_wrong_answer_from_the_server_raises_inference_error(
        server: LocalTritonServer, transport: str, mode: str) -> None:
    model = _model(server, mode, transport)
    overflows = transport == "shm" and mode in OVERFLOWS_SHM
    why = SHM_OVERFLOW if overflows else REFUSED[mode]
    # an answer too large for the request's region is not written into it
    with sent_over(transport, server, outputs_in_shm=not overflows):
        with pytest.raises(InferenceError, match=why) as caught:
            model(_inputs())
    assert f"answer_{mode}" in str(caught.value)
    assert model.stats.rows == 0, "no row of a wrong answer may be counted as answered"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_wrong_answer_in_one_piece_of_a_split_call_fails_the_whole_call(
        server: LocalTritonServer, transport: str) -> None:
    # 4 rows of 16 bytes per request: pieces of 4, 4 and 2 rows; only the 2-row piece is short
    model = _model(server, "short_last_piece", transport, max_request_bytes=4 * FEATURES * 4)
    whole_pieces = _model(server, "short_last_piece", transport, max_request_bytes=4 * FEATURES * 4)
    with sent_over(transport, server):
        _assert_right(whole_pieces(_inputs(8)), _inputs(8))  # two 4-row pieces: answered right
        handle = model.infer_async(_inputs())
        with pytest.raises(InferenceError, match="rows"):
            handle.result(timeout=60)
    assert model.stats.rows < ROWS


# -- the fallback engine is held to the same checks --------------------------------------------------

EngineFunction = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def _short_engine(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: array[:-1] for name, array in _expected(inputs).items()}


def _missing_engine(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"y": _expected(inputs)["y"]}


def _fp64_engine(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    outputs = _expected(inputs)
    return {"y": outputs["y"].astype(np.float64), "z": outputs["z"]}


WRONG_ENGINES: dict[str, tuple[EngineFunction, str]] = {
    "short": (_short_engine, "rows"),
    "missing": (_missing_engine, "z"),
    "fp64": (_fp64_engine, "float64"),
}


@pytest.fixture()
def doomed_server(tmp_path: Path) -> Iterator[LocalTritonServer]:
    """A server with only ``answer_good``, which each test stops halfway."""
    repository = tmp_path / "models"
    version_dir = repository / "answer_good" / "1"
    version_dir.mkdir(parents=True)
    (repository / "answer_good" / "config.pbtxt").write_text(
        CONFIG_PBTXT.format(name="answer_good", features=FEATURES, mode="good"))
    (version_dir / "model.py").write_text(MODEL_PY)
    running = LocalTritonServer(repository=repository, device="cpu").start()
    try:
        yield running
    finally:
        running.stop()


def _fallback_model(server: LocalTritonServer, transport: str,
                    engine: EngineFunction) -> tuple[TritonModel, list[str]]:
    """A model whose fallback factory records the model names it was asked for."""
    asked: list[str] = []

    def factory(model_name: str) -> EngineFunction:
        asked.append(model_name)
        return engine

    model = _model(server, "good", transport, fallback=factory, connect_timeout_s=2.0,
                   retry={"max_attempts": 2, "total_s": 10.0})
    return model, asked


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_correct_fallback_engine_takes_over_when_the_server_is_gone(
        doomed_server: LocalTritonServer, transport: str) -> None:
    model, asked = _fallback_model(doomed_server, transport, _expected)
    inputs = _inputs()
    with sent_over(transport, doomed_server):
        _assert_right(model(inputs), inputs)  # served by the server
    assert model.stats.fallback_rows == 0
    doomed_server.stop()
    _assert_right(model(inputs), inputs)  # served by the fallback
    assert asked == ["answer_good"]
    assert model.stats.fallback_rows == ROWS and model.stats.rows == 2 * ROWS


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("wrong", sorted(WRONG_ENGINES))
def test_a_wrong_answer_from_a_fallback_engine_raises_inference_error(
        doomed_server: LocalTritonServer, transport: str, wrong: str) -> None:
    engine, fragment = WRONG_ENGINES[wrong]
    model, asked = _fallback_model(doomed_server, transport, engine)
    inputs = _inputs()
    with sent_over(transport, doomed_server):
        _assert_right(model(inputs), inputs)  # served by the server
    doomed_server.stop()
    with pytest.raises(InferenceError, match=fragment) as caught:
        model(inputs)
    assert "fallback" in str(caught.value)
    assert asked == ["answer_good"]
    assert model.stats.fallback_rows == 0 and model.stats.rows == ROWS
