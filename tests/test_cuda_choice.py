"""``transport="auto"`` and GPU models: CUDA shared memory where it works, system memory elsewhere.

On this CPU box the real server runs every model on the CPU, and this process has no CUDA: auto
must stay on system shared memory and say why. On a GPU machine (``-m gpu`` there), the default
``TritonModel`` hands a GPU model's inputs over in CUDA memory and answers as gRPC does.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from coffea_sonic import TritonModel, zoo
from coffea_sonic.routing import clear_routers
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.server.launcher import gpu_count
from coffea_sonic.transport.messages import model_info_from_responses
from coffea_sonic.transport.shm import CudaShmTransport
from coffea_sonic.transport.shm.cuda import copy_host_to_device, probe_cuda_shared_memory


def _responses(kind: str, gpus: tuple[int, ...] = ()):
    from tritonclient.grpc import model_config_pb2, service_pb2

    config = model_config_pb2.ModelConfig(name="m", backend="python", max_batch_size=8)
    config.input.add(name="x", data_type=model_config_pb2.TYPE_FP32, dims=[3])
    config.output.add(name="y", data_type=model_config_pb2.TYPE_FP32, dims=[1])
    config.instance_group.add(kind=getattr(model_config_pb2.ModelInstanceGroup, kind), count=2,
                              gpus=list(gpus))
    metadata = service_pb2.ModelMetadataResponse(name="m", versions=["1"], platform="python")
    return metadata, service_pb2.ModelConfigResponse(config=config)


@pytest.mark.parametrize("kind, gpus, on_gpu, on_gpu_zero", [
    ("KIND_GPU", (0,), True, True), ("KIND_GPU", (0, 1), True, False), ("KIND_GPU", (1,), True, False),
    ("KIND_CPU", (), False, False)])
def test_model_info_says_on_which_gpus_the_server_runs_the_model(kind, gpus, on_gpu, on_gpu_zero):
    info = model_info_from_responses(*_responses(kind, gpus))
    assert info.gpus == gpus and info.gpu is on_gpu and info.on_gpu_zero is on_gpu_zero
    # where a model runs is not part of its signature: CPU and GPU servers of it are compatible
    assert info.checksum == model_info_from_responses(*_responses("KIND_CPU")).checksum


def test_a_cpu_model_on_this_host_goes_through_system_shared_memory(triton_server):
    clear_routers()
    model = TritonModel(triton_server.url("jet_tagger"))
    assert model.info.gpu is False
    assert model.transport_kind == "shm"


@pytest.mark.skipif(CudaShmTransport.available(), reason="this process has CUDA")
def test_without_cuda_auto_keeps_a_gpu_model_on_system_shared_memory(triton_server, caplog):
    clear_routers()
    model = TritonModel(triton_server.url("jet_tagger"))
    model.info  # the router and its endpoint exist from here on
    router = model._get_runtime().router
    (endpoint,) = router.endpoints
    usable, why = probe_cuda_shared_memory(endpoint.control)
    assert not usable and "no CUDA" in why
    with caplog.at_level(logging.INFO, logger="coffea_sonic.transport.choice"):
        transport = router.data_transport(endpoint, gpu_model=True)
    assert transport.name == "shm" and "no CUDA" in endpoint.cuda_off
    assert "system shared memory (this process has no CUDA" in caplog.text
    # decided once: asked again, the same transport, without a second probe or log line
    caplog.clear()
    assert router.data_transport(endpoint, gpu_model=True) is transport and not caplog.text
    # and requests still come back right
    inputs = zoo.example_inputs("jet_tagger", 300, seed=4)
    output = zoo.spec("jet_tagger").outputs[0]
    assert model(inputs)[output.name].shape == (300, *output.dims)


def test_transport_cuda_is_a_name_a_user_may_give():
    assert "transport='cuda'" in repr(TritonModel("triton+grpc://127.0.0.1:1/m", transport="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not CudaShmTransport.available(), reason="needs torch with a CUDA GPU")
def test_staged_host_to_device_copy_is_exact():
    import torch

    for nbytes in (1000, 2 * 2**20 + 12, 19 * 2**20 + 4):  # small (one copy) and staged sizes
        source = np.random.default_rng(nbytes).integers(0, 255, nbytes, dtype=np.uint8)
        target = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        copy_host_to_device(source, target)
        torch.cuda.current_stream().synchronize()
        assert np.array_equal(target.cpu().numpy(), source)


@pytest.mark.gpu
@pytest.mark.skipif(not CudaShmTransport.available(), reason="needs torch with a CUDA GPU")
def test_default_tritonmodel_sends_gpu_models_through_cuda_memory():
    """A GPU server on this host: auto picks CUDA memory for its GPU models; outputs equal the
    plain-gRPC answers, and ``transport="shm"`` still means system memory. (Not bit for bit:
    gRPC sends 4 MiB pieces, CUDA memory the whole chunk, and cuDNN may choose other kernels
    for another batch size.)"""
    clear_routers()
    with LocalTritonServer(models=["emtrk_cnn", "jet_tagger"], device="gpu", gpus=[0]) as server:
        for name, rows in (("emtrk_cnn", 2048), ("jet_tagger", 65536)):
            inputs = zoo.example_inputs(name, rows, seed=3)
            auto = TritonModel(server.url(name))
            assert auto.info.gpu and auto.transport_kind == "cuda"
            expected = TritonModel(server.url(name), transport="grpc")(inputs)
            got = auto(inputs)
            for key, want in expected.items():
                np.testing.assert_allclose(got[key], want, rtol=0, atol=1e-5, err_msg=name)
            assert TritonModel(server.url(name), transport="shm").transport_kind == "shm"


@pytest.mark.gpu
@pytest.mark.skipif(not CudaShmTransport.available() or gpu_count() < 2,
                    reason="needs torch with CUDA and two GPUs")
def test_instances_on_several_gpus_get_system_memory_and_cuda_memory_still_works_when_asked():
    """The default GPU server puts instances on every GPU. The client's CUDA memory would sit on
    GPU 0 and the other GPUs' instances copy every input from there, so ``auto`` sends system
    memory (each instance copies to its own GPU); ``transport="cuda"`` still answers right."""
    clear_routers()
    with LocalTritonServer(models=["particlenet", "emtrk_cnn"], device="gpu") as server:
        for name, rows in (("particlenet", 512), ("emtrk_cnn", 256)):
            inputs = zoo.example_inputs(name, rows, seed=5)
            expected = TritonModel(server.url(name), transport="grpc")(inputs)
            auto = TritonModel(server.url(name))
            assert auto.info.gpus == (0, 1) and auto.transport_kind == "shm"
            cuda = TritonModel(server.url(name), transport="cuda", max_in_flight=8,
                               max_request_bytes=2**20)
            assert cuda.transport_kind == "cuda"
            handles = [cuda.infer_async(inputs) for _ in range(24)]  # enough for every instance
            for handle in handles:
                got = handle.result()
                for key, want in expected.items():
                    np.testing.assert_allclose(got[key], want, rtol=0, atol=1e-5, err_msg=name)
