"""``ModelInfo.checksum`` covers the served config's parts that change answers: a model whose
ONNX graph optimisation level or label file differs gets another checksum (so ``expected_checksum``
refuses it and provenance tells the two apart), while instance counts and batching do not."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from coffea_sonic import TritonModel
from coffea_sonic.errors import SonicError
from coffea_sonic.server import LocalTritonServer
from experiment_repository import experiment_repository

pytest.importorskip("torch")  # the repository's models are exported by torch


def _variant(source, target, old: str, new: str):
    shutil.copytree(source, target)
    config = target / "mass_reg" / "config.pbtxt"
    text = config.read_text()
    assert old in text, text
    config.write_text(text.replace(old, new))
    return target


def test_checksum_follows_what_changes_answers_not_how_the_model_is_run(tmp_path):
    base = experiment_repository(tmp_path / "base")
    for name in ("pnet_onnx", "pnet_ts"):  # one small model is enough here
        shutil.rmtree(base / name)
    instances = _variant(base, tmp_path / "instances", "kind: KIND_CPU count: 1 } ]",
                         "kind: KIND_CPU count: 2 } ]\ndynamic_batching { }")
    level = _variant(base, tmp_path / "level", "graph { level: 0 }", "graph { level: 1 }")
    labels = _variant(base, tmp_path / "labels", 'label_filename: "labels.txt" ', "")
    features = np.random.default_rng(1).normal(size=(20, 6)).astype(np.float32)
    checksums, answers = {}, {}
    for name, repository in (("base", base), ("instances", instances), ("level", level),
                             ("labels", labels)):
        with LocalTritonServer(repository=repository, device="cpu").start() as server:
            model = TritonModel(server.url("mass_reg"), fallback="off")
            try:
                answers[name] = model({"features": features})["mass"]
                checksums[name] = model.info.checksum
                if name == "level":  # HTTP reads the same config: the same checksum
                    http = TritonModel(f"triton+http://{server.http_address}/mass_reg",
                                       fallback="off")
                    try:
                        assert http.info.checksum == model.info.checksum
                    finally:
                        http.close()
                    pinned = TritonModel(server.url("mass_reg"), fallback="off",
                                         expected_checksum=checksums["base"])
                    with pytest.raises(SonicError, match=checksums["level"]):
                        pinned({"features": features})
            finally:
                model.close()
    assert checksums["instances"] == checksums["base"]
    assert len({checksums["base"], checksums["level"], checksums["labels"]}) == 3
    for name in ("instances", "level", "labels"):  # same weights: the checksum is the config's
        np.testing.assert_allclose(answers[name], answers["base"], atol=1e-5)


def _config(**changes):
    """A served config of one model, as Triton reports it, with ``changes`` applied."""
    from tritonclient.grpc import model_config_pb2

    config = model_config_pb2.ModelConfig(name="tagger", backend="python", max_batch_size=64)
    config.input.add(name="x", data_type=model_config_pb2.TYPE_FP32, dims=[6])
    config.output.add(name="probs", data_type=model_config_pb2.TYPE_FP32, dims=[3])
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    for change in changes.values():
        change(config)
    return config


def _checksum(config) -> str:
    from tritonclient.grpc import service_pb2

    from coffea_sonic.transport.messages import model_info_from_responses

    metadata = service_pb2.ModelMetadataResponse(name=config.name, versions=["1"])
    return model_info_from_responses(metadata,
                                     service_pb2.ModelConfigResponse(config=config)).checksum


def _gpu_group(config):
    config.instance_group[0].kind = config.instance_group[0].KIND_GPU
    config.instance_group[0].count = 3
    config.instance_group[0].gpus[:] = [0, 1]


def _accelerator(precision: str):
    def change(config):
        trt = config.optimization.execution_accelerators.gpu_execution_accelerator.add(
            name="tensorrt")
        trt.parameters["precision_mode"] = precision
    return change


def _step(version: int):
    def change(config):
        config.ensemble_scheduling.step.add(model_name="stage", model_version=version)
    return change


PLACEMENT = {
    "instances and GPUs": _gpu_group,
    "batching": lambda c: c.dynamic_batching.preferred_batch_size.extend([16, 32]),
    "backend parameters": lambda c: c.parameters["device"].MergeFrom(
        type(c.parameters["device"])(string_value="gpu")),
    "response cache": lambda c: setattr(c.response_cache, "enable", True),
    "pinned memory": lambda c: setattr(c.optimization.input_pinned_memory, "enable", True),
}
ANSWERING = {
    "graph level": lambda c: setattr(c.optimization.graph, "level", 1),
    "TensorRT FP32": _accelerator("FP32"),
    "TensorRT FP16": _accelerator("FP16"),
    "label file": lambda c: setattr(c.output[0], "label_filename", "labels.txt"),
    "model file": lambda c: setattr(c, "default_model_filename", "model_fp16.onnx"),
    "ensemble step": _step(1),
    "ensemble step version": _step(2),
}


def test_where_and_how_fast_a_server_runs_the_model_leave_the_checksum_alone():
    plain = _checksum(_config())
    assert _checksum(_config(**PLACEMENT)) == plain
    for name, change in PLACEMENT.items():
        assert _checksum(_config(change=change)) == plain, name


def test_every_served_config_part_that_changes_answers_changes_the_checksum():
    found = {name: _checksum(_config(change=change)) for name, change in ANSWERING.items()}
    found["plain"] = _checksum(_config())
    assert len(set(found.values())) == len(found), found

