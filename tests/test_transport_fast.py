"""Fast transports other than system shared memory, against the real embedded tritonserver.

HTTP with binary tensors (plain and compressed) and CUDA shared memory (GPU machine only) must
answer exactly what plain gRPC answers, fail with our errors, and survive pickling.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from coffea_sonic import zoo
from coffea_sonic.errors import ModelNotFoundError, ServerUnavailableError
from coffea_sonic.server.launcher import free_port
from coffea_sonic.transport.codec import decode_response
from coffea_sonic.transport.http import HttpBinaryTransport
from coffea_sonic.transport.shm import CudaShmTransport
from helpers import grpc_reference, run_in_threads

ROWS = {"jet_tagger": 300, "particlenet_lite": 40, "emtrk_cnn": 12}


def assert_same_rows(got: np.ndarray, want: np.ndarray) -> None:
    """Concurrent requests may be batched together by Triton, and onnxruntime's float sums then
    differ in the last bits (as they do in-process for other batch sizes): equal to 1e-6."""
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def http(triton_server):
    with HttpBinaryTransport(triton_server.http_address) as transport:
        yield transport


@pytest.mark.parametrize("name", sorted(ROWS))
def test_http_binary_outputs_identical_to_plain_grpc(triton_server, http, name):
    inputs = zoo.example_inputs(name, ROWS[name], seed=7)
    expected = grpc_reference(triton_server.grpc_address, name, inputs)
    got = http.infer(name, "", inputs, zoo.spec(name).outputs)
    assert sorted(got) == sorted(expected)
    for key in expected:
        assert got[key].dtype == expected[key].dtype and np.array_equal(got[key], expected[key])


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_compressed_http_outputs_identical_to_plain_grpc(triton_server, compression):
    inputs = zoo.example_inputs("particlenet_lite", 25, seed=8)
    expected = grpc_reference(triton_server.grpc_address, "particlenet_lite", inputs)
    with HttpBinaryTransport(triton_server.http_address, compression=compression) as zipped:
        got = zipped.infer("particlenet_lite", "", inputs)  # no output list: all outputs
        assert zipped.stats["requests"] == 1
    assert np.array_equal(got["probs"], expected["probs"])


def test_http_futures_from_many_threads_are_each_answered_in_order(triton_server, http):
    inputs = [zoo.example_inputs("jet_tagger", 200 + seed, seed=seed) for seed in range(8)]
    expected = [grpc_reference(triton_server.grpc_address, "jet_tagger", x)["probs"] for x in inputs]
    futures = [http.submit("jet_tagger", "", x, zoo.spec("jet_tagger").outputs) for x in inputs]
    for future, want in zip(futures, expected):
        assert_same_rows(future.outputs(timeout=60)["probs"], want)
    # the gRPC-future shape TritonModel consumes
    response = futures[0].result()
    assert_same_rows(decode_response(response)["probs"], expected[0])

    def hammer(index: int) -> None:
        got = http.infer("jet_tagger", "", inputs[index], zoo.spec("jet_tagger").outputs)
        assert_same_rows(got["probs"], expected[index])

    run_in_threads(hammer, [(i,) for i in range(8)], timeout=120)


def test_http_unknown_model_is_model_not_found(http):
    with pytest.raises(ModelNotFoundError, match="no_such_model"):
        http.infer("no_such_model", "", {"x": np.zeros((1, 2), np.float32)})
    future = http.submit("no_such_model", "", {"x": np.zeros((1, 2), np.float32)})
    assert isinstance(future.exception(timeout=30), ModelNotFoundError)


def test_http_unreachable_server_is_server_unavailable():
    with HttpBinaryTransport(f"127.0.0.1:{free_port()}") as nowhere:
        with pytest.raises(ServerUnavailableError, match="HTTP port"):
            nowhere.infer("jet_tagger", "", zoo.example_inputs("jet_tagger", 2))


def test_http_transport_pickles_as_configuration(triton_server):
    transport = HttpBinaryTransport(triton_server.http_address, compression="gzip",
                                    headers={"x-analysis": "ttbar"})
    copy = pickle.loads(pickle.dumps(transport))
    assert (copy.address, copy.compression, copy.headers) == (
        transport.address, "gzip", {"x-analysis": "ttbar"})
    got = copy.infer("jet_tagger", "", zoo.example_inputs("jet_tagger", 3))
    assert got["probs"].shape == (3, 3)
    copy.close()
    transport.close()


@pytest.mark.gpu
@pytest.mark.skipif(not CudaShmTransport.available(), reason="needs torch with a CUDA GPU")
def test_cuda_shm_outputs_identical_to_plain_grpc():
    import torch

    from coffea_sonic.server import LocalTritonServer

    with LocalTritonServer(models=["emtrk_cnn", "jet_tagger"], device="gpu") as server:
        with CudaShmTransport(server.grpc_address) as cuda:
            for name, rows in (("emtrk_cnn", 64), ("jet_tagger", 1000)):
                inputs = zoo.example_inputs(name, rows, seed=9)
                expected = grpc_reference(server.grpc_address, name, inputs)
                on_gpu = {key: torch.from_numpy(value).cuda() for key, value in inputs.items()}
                got = cuda.infer(name, "", on_gpu, zoo.spec(name).outputs)
                for key in expected:
                    assert got[key].is_cuda
                    assert np.array_equal(got[key].cpu().numpy(), expected[key])
            assert cuda.regions()
        assert cuda.regions() == []
