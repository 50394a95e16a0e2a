"""Triton's response cache on the embedded server: identical requests are answered without
running the model, over gRPC, system shared memory and HTTP (the server's statistics and its
Prometheus metrics prove it); ``models add --response-cache`` and ``monitor``'s hit rate; no
CUDA shared memory for a model with the cache on."""

from __future__ import annotations

import io

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from coffea_sonic import zoo
from coffea_sonic.cli import main as cli_main
from coffea_sonic.facility.monitor import monitor
from coffea_sonic.model import TritonModel
from coffea_sonic.routing import clear_routers
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.stats import counted_since
from server_side import sent_over


@pytest.fixture(scope="module")
def cached_server():
    with LocalTritonServer(models=["jet_tagger"], device="cpu", response_cache="64MB") as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh_routers():
    clear_routers()
    yield
    clear_routers()


@pytest.mark.parametrize("transport, seed", [("grpc", 1), ("shm", 2), ("http", 3)])
def test_an_identical_request_is_answered_from_the_servers_cache(cached_server, transport, seed):
    url = (f"triton+http://{cached_server.http_address}/jet_tagger" if transport == "http"
           else cached_server.url("jet_tagger"))
    model = TritonModel(url, transport="auto" if transport == "http" else transport)
    assert model.info.response_cache and model.transport_kind == transport
    inputs = zoo.example_inputs("jet_tagger", 2_000, seed=seed)
    before = model.server_statistics()
    with sent_over(transport, cached_server) as wire:
        first = model(inputs)["probs"]
        second = model(inputs)["probs"]
    if transport == "shm":  # the answer from the cache is written into the request's region too
        assert wire.shm_outputs == 2, wire
    delta = counted_since(model.server_statistics, before, 2)  # counted just after answering
    np.testing.assert_array_equal(first, second)
    assert (delta.success_count, delta.execution_count) == (2, 1)  # the model ran once
    assert (delta.cache_miss_count, delta.cache_hit_count) == (1, 1)


def test_monitor_shows_the_response_cache_hit_rate(cached_server):
    model = TritonModel(cached_server.url("jet_tagger"), transport="grpc")
    inputs = zoo.example_inputs("jet_tagger", 500, seed=4)
    for _ in range(4):
        model(inputs)
    for target in (cached_server.metrics_url, cached_server.url("jet_tagger")):
        out = io.StringIO()
        assert monitor([target], frames=1, out=out, color=False) == 0
        header, row = [line for line in out.getvalue().splitlines()
                       if "CACHE HIT" in line or line.strip().startswith("jet_tagger")][:2]
        assert header.split()[-2:] == ["CACHE", "HIT"]
        rate = int(row.split()[-1].rstrip("%"))
        assert 0 < rate < 100, out.getvalue()  # since start: every test's hits and misses


def test_models_add_response_cache_then_serve_with_a_cache_size(tmp_path, capsys):
    repository = tmp_path / "repo"
    assert cli_main(["models", "add", str(zoo.onnx_path("jet_tagger")), "--name", "tagger",
                     "-o", str(repository), "--response-cache"]) == 0
    config = text_format.Parse((repository / "tagger" / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    assert config.response_cache.enable
    with LocalTritonServer(repository=repository, device="cpu", response_cache="16MB") as server:
        model = TritonModel(server.url("tagger"))
        inputs = {"features": zoo.example_inputs("jet_tagger", 300, seed=5)["features"]}
        model(inputs)
        model(inputs)
        stats = model.server_statistics()
        assert (stats.cache_hit_count, stats.execution_count) == (1, 1)


def test_a_model_with_the_response_cache_is_not_sent_through_cuda_memory():
    from coffea_sonic.core.tensors import ModelInfo, TensorInfo

    tensors = (TensorInfo("x", "FP32", (4,)),)
    plain = ModelInfo("m", ("1",), "onnxruntime_onnx", 8, tensors, tensors, gpus=(0,))
    cached = ModelInfo("m", ("1",), "onnxruntime_onnx", 8, tensors, tensors, gpus=(0,),
                       response_cache=True)
    assert plain.on_gpu_zero and not cached.on_gpu_zero
    assert plain.checksum == cached.checksum  # the cache does not change what is answered
