"""System shared-memory transport (coffea_sonic.transport.shm) against real tritonservers.

Answers equal in-process onnxruntime; outputs reach ``out`` destinations with one copy (traced
allocations stay far below the output's size, where plain gRPC allocates at least that); slots are
reused, grown on demand and shared by threads; a full ``/dev/shm`` sends tensors in the gRPC message
(one warning); a cancelled request's slot comes back once answered, a failed one's is dropped; a
region the server does not know fails as ``shm_region``; a server restricting the shared-memory
protocol fails as ``restricted``; the probe accepts a direct server and rejects two servers behind
a per-request load balancer (HAProxy); regions are gone after a client exits, raises or is killed
(swept). On a GPU machine, the CUDA transport runs against a fake Triton that maps its regions
through CUDA IPC, and against a GPU tritonserver when there is one.
"""

from __future__ import annotations

import errno
import importlib.util
import logging
import os
import pickle
import shutil
import subprocess
import tracemalloc

import numpy as np
import pytest

from coffea_sonic import zoo
from coffea_sonic.core.endpoint import ServerSettings
from coffea_sonic.engines import CpuEngine
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.server.launcher import free_port
from coffea_sonic.transport.base import InferRequest
from coffea_sonic.transport.errors import TransportError
from coffea_sonic.transport.grpc import GrpcTransport
from coffea_sonic.transport.shm import (CudaShmTransport, SystemShmTransport, forget_probes,
                                        probe_shared_memory, region_prefix, sweep_stale_regions)
from coffea_sonic.transport.shm.regions import SystemRegion
from helpers import grpc_reference, run_in_threads, wait_for

MODEL = "jet_tagger"
OUTPUTS = zoo.declared_info(MODEL).outputs


@pytest.fixture(scope="module")
def server():
    started = LocalTritonServer(models=[MODEL], device="cpu").start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def reference():
    return CpuEngine(MODEL, threads=1)


@pytest.fixture
def transport(server):
    with SystemShmTransport(ServerSettings(server.grpc_address)) as opened:
        yield opened


def request(rows: int, seed: int = 0, **options) -> InferRequest:
    return InferRequest(MODEL, "", zoo.example_inputs(MODEL, rows, seed), OUTPUTS, rows=rows,
                        **options)


def server_regions(grpc: GrpcTransport) -> list[str]:
    from tritonclient.grpc import service_pb2

    status = grpc.rpc("SystemSharedMemoryStatus", service_pb2.SystemSharedMemoryStatusRequest(), 10)
    return sorted(name for name in status.regions if name.startswith(region_prefix()))


def unregister(grpc: GrpcTransport, name: str) -> None:
    from tritonclient.grpc import service_pb2

    grpc.rpc("SystemSharedMemoryUnregister",
             service_pb2.SystemSharedMemoryUnregisterRequest(name=name), 10)


def test_outputs_equal_in_process_onnxruntime(transport, reference):
    sent = request(1000, seed=1)
    answer = transport.infer(sent)
    want = reference(sent.inputs)["probs"]
    assert list(answer.outputs) == ["probs"] and answer.model_version == "1"
    assert answer.outputs["probs"].shape == want.shape
    np.testing.assert_allclose(answer.outputs["probs"], want, atol=1e-5)
    assert answer.outputs["probs"].flags.owndata  # a copy, not a view of the reused slot
    assert transport.stats["shm_requests"] == 1 and transport.stats["inline_requests"] == 0
    assert len(transport.regions()) == 1
    assert server_regions(transport.grpc) == transport.regions()  # registered, reused later
    again = transport.infer(request(10, seed=2))
    np.testing.assert_allclose(again.outputs["probs"], reference(request(10, seed=2).inputs)["probs"],
                               atol=1e-5)
    assert len(transport.regions()) == 1 and transport.pool.stats["regions_made"] == 1


def traced_peak(send) -> int:
    tracemalloc.start()
    try:
        send()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_out_destinations_receive_the_rows_with_one_copy(server, transport, reference):
    rows = 65_536  # jet_tagger's max_batch_size: 786 kB of output
    sent = request(rows, seed=3, out={"probs": np.full((rows, 3), np.nan, np.float32)})
    transport.infer(request(rows, seed=4))  # the slot exists before measuring
    target = sent.out["probs"]
    answers = []
    peak = traced_peak(lambda: answers.append(transport.infer(sent)))
    answer = answers[0]
    assert answer.delivered == frozenset({"probs"}) and answer.outputs["probs"] is target
    np.testing.assert_allclose(target, reference(sent.inputs)["probs"], atol=1e-5)
    # one copy, slot -> destination: no output-sized allocation at all
    print(f"traced peak {peak} bytes for a {target.nbytes}-byte output")
    assert peak < target.nbytes // 4, f"{peak} bytes traced for a {target.nbytes}-byte output"
    # the same measurement sees plain gRPC's response bytes (so it would see a copy)
    grpc = GrpcTransport(ServerSettings(server.grpc_address))
    grpc_peak = traced_peak(lambda: grpc.infer(request(rows, seed=3, out={"probs": target})))
    print(f"plain gRPC: traced peak {grpc_peak} bytes")
    assert grpc_peak > target.nbytes


def test_a_delivered_slice_and_an_undeliverable_output(transport, reference):
    rows = 500
    sent = request(rows, seed=5, out={"probs": np.zeros((300, 3), np.float32)})
    answer = transport.infer(sent)
    want = reference(sent.inputs)["probs"]
    np.testing.assert_allclose(sent.out["probs"], want[:300], atol=1e-5)  # the first rows
    wrong = request(rows, seed=5, out={"probs": np.zeros((rows, 4), np.float32)})
    answer = transport.infer(wrong)  # per-row shape differs: copied out, for the client to check
    assert answer.delivered == frozenset() and answer.outputs["probs"].flags.owndata
    np.testing.assert_allclose(answer.outputs["probs"], want, atol=1e-5)


def test_every_slot_busy_sends_inline(server, reference):
    with SystemShmTransport(ServerSettings(server.grpc_address), max_slots=1) as one_slot:
        # the only slot is taken, as by a request in flight (no race with a fast answer)
        held = one_slot.pool.acquire(1 << 20, 30)
        assert held is not None
        try:
            sent = [request(20_000, seed=seed) for seed in range(3)]
            futures = [one_slot.submit(piece) for piece in sent]
            for piece, future in zip(sent, futures):
                np.testing.assert_allclose(future.result(60).outputs["probs"],
                                           reference(piece.inputs)["probs"], atol=1e-5)
        finally:
            one_slot.pool.release(held)
        assert one_slot.stats["inline_requests"] >= 1 and one_slot.pool.stats["all_busy"] >= 1
        assert len(one_slot.regions()) == 1


def test_a_full_pool_replaces_a_too_small_slot_by_a_bigger_one(server, reference):
    with SystemShmTransport(ServerSettings(server.grpc_address), max_slots=1) as one_slot:
        one_slot.infer(request(10))
        first = one_slot.regions()
        one_slot.infer(request(10, seed=1))
        assert one_slot.regions() == first  # reused
        big = request(60_000, seed=2)  # 1.4 MB of inputs + 720 kB of outputs: over the 1 MiB slot
        answer = one_slot.infer(big)
        np.testing.assert_allclose(answer.outputs["probs"], reference(big.inputs)["probs"],
                                   atol=1e-5)
        grown = one_slot.regions()
        assert len(grown) == 1 and grown != first and one_slot.stats["inline_requests"] == 0
        # the small one unregistered first (again a moment later where the server still held it:
        # Triton lets go of a region just after answering the request that used it)
        wait_for(lambda: server_regions(one_slot.grpc) == grown, timeout=10,
                 what=lambda: f"the server to list only {grown}: {server_regions(one_slot.grpc)}")
        one_slot.infer(request(10, seed=3))
        assert one_slot.regions() == grown and one_slot.pool.stats["regions_made"] == 2
    assert set(grown).isdisjoint(server_regions(one_slot.grpc))


def test_threads_share_the_slots(server, reference):
    sent = [request(500, seed=seed) for seed in range(6)]
    answers: dict[int, list[np.ndarray]] = {}
    with SystemShmTransport(ServerSettings(server.grpc_address), max_slots=3) as pooled:
        def work(index: int) -> None:
            answers[index] = [pooled.infer(sent[index]).outputs["probs"] for _ in range(3)]

        run_in_threads(work, [(i,) for i in range(6)], timeout=120)
        assert pooled.stats["requests"] == 18 and pooled.stats["shm_requests"] >= 3
        assert len(pooled.regions()) <= 3 and pooled.pool.stats["regions_made"] <= 3
    # checked after every thread is done: no answer is a view of a slot reused since
    for index, piece in enumerate(sent):
        want = reference(piece.inputs)["probs"]
        for got in answers[index]:
            # concurrent requests may share a dynamic batch: onnxruntime's sums then differ in
            # the last bits, as in-process inference on another batch size would
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_full_dev_shm_sends_inline_with_one_warning(server, reference, monkeypatch, caplog):
    def no_room(self, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SystemRegion, "__init__", no_room)
    with caplog.at_level(logging.WARNING, logger="coffea_sonic.transport.shm"):
        with SystemShmTransport(ServerSettings(server.grpc_address)) as starved:
            for seed in range(3):
                sent = request(40, seed=seed)
                np.testing.assert_allclose(starved.infer(sent).outputs["probs"],
                                           reference(sent.inputs)["probs"], atol=1e-5)
            assert starved.stats["inline_requests"] == 3 and starved.stats["shm_requests"] == 0
            assert starved.regions() == [] and "No space left" in starved.pool.disabled
    warnings = [r for r in caplog.records if "Make /dev/shm larger" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_a_cancelled_request_gives_its_slot_back_once_answered(server):
    with SystemShmTransport(ServerSettings(server.grpc_address), max_slots=1) as cancelling:
        for _ in range(5):  # cancel() is False only if the server answered first (unlikely)
            future = cancelling.submit(request(65_536, seed=6))
            if future.cancel():
                break
        assert future.cancelled()
        # the call runs to its answer (the server is done with the slot), then the slot is free:
        # the next request goes through it, not inline
        sent = cancelling.stats["shm_requests"]

        def reused() -> bool:
            answer = cancelling.infer(request(10))
            assert answer.outputs["probs"].shape == (10, 3)
            return cancelling.stats["shm_requests"] > sent

        wait_for(reused, 60, "the slot reused")
        assert cancelling.regions() and cancelling.pool.stats["regions_dropped"] == 0


def test_region_unknown_to_the_server_is_shm_region(transport):
    transport.infer(request(10))
    transport.infer(request(10))
    (name,) = transport.regions()
    unregister(transport.grpc, name)  # behind the transport's back (a restart, a balancer)
    future = transport.submit(request(10))
    error = future.exception(60)
    assert isinstance(error, TransportError) and error.kind == "shm_region", error
    assert name in error.detail and not error.retryable
    assert transport.regions() == [] and transport.stats["shm_region_errors"] == 1
    assert transport.infer(request(10)).outputs["probs"].shape == (10, 3)  # no retry inside, but
    assert transport.regions() != [name]                                   # a new region next


def test_server_errors_are_classified_and_drop_the_slot(transport):
    future = transport.submit(InferRequest("no_such_model", "", {"features": np.zeros((2, 6),
                                           np.float32)}, OUTPUTS, rows=2))
    error = future.exception(60)
    assert isinstance(error, TransportError) and error.kind == "not_found", error
    assert transport.regions() == [] and transport.pool.stats["regions_dropped"] == 1
    assert transport.infer(request(5)).outputs["probs"].shape == (5, 3)  # on a fresh slot
    assert transport.pool.stats["regions_made"] == 2 and len(transport.regions()) == 1


def test_pickles_as_configuration(server):
    with SystemShmTransport(ServerSettings(server.grpc_address), max_slots=3) as original:
        original.infer(request(5))
        copy = pickle.loads(pickle.dumps(original))
        assert (copy.settings, copy.max_slots, copy.regions()) == (original.settings, 3, [])
        assert copy.infer(request(5)).outputs["probs"].shape == (5, 3)
        copy.close()


def test_probe_accepts_a_direct_server(server):
    grpc = GrpcTransport(ServerSettings(server.grpc_address))
    forget_probes()
    before = set(server_regions(grpc))  # this module's earlier transports may keep theirs
    usable, why = probe_shared_memory(grpc)
    assert usable, why
    assert set(server_regions(grpc)) <= before  # the probe region is gone
    assert probe_shared_memory(grpc) == (usable, why)  # cached per process and settings


def test_restricted_shared_memory_protocol_is_restricted():
    with LocalTritonServer(models=[MODEL], device="cpu", extra_args=[
            "--grpc-restricted-protocol=shared-memory:csonic-key=s3cret"]) as restricted:
        settings = ServerSettings(restricted.grpc_address)
        with SystemShmTransport(settings) as refused:
            error = refused.submit(request(10)).exception(60)
            assert isinstance(error, TransportError) and error.kind == "restricted", error
        usable, why = probe_shared_memory(GrpcTransport(settings))
        assert not usable and "restricted" in why
        keyed = ServerSettings.build(restricted.grpc_address, protocol_key=("csonic-key", "s3cret"))
        with SystemShmTransport(keyed) as allowed:
            assert allowed.infer(request(10)).outputs["probs"].shape == (10, 3)
        assert probe_shared_memory(GrpcTransport(keyed))[0]


HAPROXY = """
global
  maxconn 256
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend grpc
  bind 127.0.0.1:{port} proto h2
  default_backend tritons
backend tritons
  balance roundrobin
{servers}
"""


def start_haproxy(tmp_path, addresses: list[str]) -> tuple[subprocess.Popen, str]:
    """HAProxy balancing gRPC per request over ``addresses`` (retried on a taken port)."""
    servers = "\n".join(f"  server s{i} {address} proto h2 check"
                        for i, address in enumerate(addresses))
    for _ in range(5):
        port = free_port()
        config = tmp_path / "haproxy.cfg"
        config.write_text(HAPROXY.format(port=port, servers=servers))
        process = subprocess.Popen(["haproxy", "-f", str(config)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)
        grpc = GrpcTransport(ServerSettings(f"127.0.0.1:{port}"))
        try:
            wait_for(lambda: process.poll() is not None or grpc.ready(2), 30, "HAProxy serving",
                     ignoring=(TransportError,))
        except AssertionError:
            process.kill()
            raise
        if process.poll() is None:
            return process, f"127.0.0.1:{port}"
    raise AssertionError(f"HAProxy did not start: {process.stderr.read().decode()[-500:]}")


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy (apt-get install haproxy)")
def test_probe_rejects_servers_behind_a_load_balancer(server, tmp_path):
    with LocalTritonServer(models=[MODEL], device="cpu") as second:
        proxy, address = start_haproxy(tmp_path, [server.grpc_address, second.grpc_address])
        try:
            backends = [GrpcTransport(ServerSettings(backend.grpc_address))
                        for backend in (server, second)]
            before = [set(server_regions(backend)) for backend in backends]
            balanced = GrpcTransport(ServerSettings(address))
            usable, why = probe_shared_memory(balanced)
            assert not usable and "load balancer" in why, why
            for backend, held in zip(backends, before):  # the probe region is gone from both
                assert set(server_regions(backend)) <= held
            # what auto would have run into: the request reaches the other server
            with SystemShmTransport(ServerSettings(address)) as fooled:
                kinds = set()
                for _ in range(4):
                    try:
                        fooled.infer(request(10))
                        kinds.add("ok")
                    except TransportError as error:
                        kinds.add(error.kind)
                assert "shm_region" in kinds, kinds
        finally:
            proxy.terminate()
            proxy.wait(10)


def test_a_forked_child_never_touches_the_parents_regions(server):
    import multiprocessing

    with SystemShmTransport(ServerSettings(server.grpc_address)) as parent:
        parent.infer(request(10))
        mine = parent.regions()

        def child(queue) -> None:
            try:
                answer = parent.infer(request(10))  # its own region, registered by the child
                theirs = parent.regions()
                parent.close()
                queue.put((answer.outputs["probs"].shape, theirs))
            except BaseException as error:  # noqa: BLE001
                queue.put(repr(error))

        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        process = context.Process(target=child, args=(queue,))
        process.start()
        result = queue.get(timeout=60)
        process.join(30)
        assert result[0] == (10, 3) and result[1] and set(result[1]).isdisjoint(mine), result
        assert parent.regions() == mine and set(mine) <= set(server_regions(parent.grpc))
        assert parent.infer(request(10)).outputs["probs"].shape == (10, 3)
        assert not any(name.startswith(region_prefix(process.pid))
                       for name in server_regions(parent.grpc))


def test_no_regions_left_after_close(server):
    settings = ServerSettings(server.grpc_address)
    with SystemShmTransport(settings) as closing:
        closing.infer(request(10))
        names = closing.regions()
    assert closing.regions() == []
    assert set(names).isdisjoint(server_regions(GrpcTransport(settings)))
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(region_prefix())]


CLIENT = """
import json, os, signal, sys
from coffea_sonic import zoo
from coffea_sonic.core.endpoint import ServerSettings
from coffea_sonic.transport.base import InferRequest
from coffea_sonic.transport.shm import SystemShmTransport
address, ending = sys.argv[1], sys.argv[2]
transport = SystemShmTransport(ServerSettings(address))
answer = transport.infer(InferRequest("jet_tagger", "", zoo.example_inputs("jet_tagger", 100),
                                      zoo.declared_info("jet_tagger").outputs, rows=100))
print(json.dumps({"pid": os.getpid(), "regions": transport.regions()}), flush=True)
if ending == "exception":
    raise RuntimeError("analysis failed after inference")
if ending == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("ending, sweeper", [("exit", None), ("exception", None),
                                             ("sigkill", "next client"), ("sigkill", "sweep")])
def test_regions_of_an_ended_client_are_gone(server, ending, sweeper):
    import json
    import signal
    import sys

    done = subprocess.run([sys.executable, "-c", CLIENT, server.grpc_address, ending],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout, done.stderr
    report = json.loads(done.stdout.splitlines()[0])
    assert done.returncode == {"exit": 0, "exception": 1, "sigkill": -signal.SIGKILL}[ending]
    prefix = region_prefix(report["pid"])
    assert len(report["regions"]) == 1 and report["regions"][0].startswith(prefix)
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]  # unlinked
    grpc = GrpcTransport(ServerSettings(server.grpc_address))
    from tritonclient.grpc import service_pb2

    def registered() -> list[str]:
        status = grpc.rpc("SystemSharedMemoryStatus",
                          service_pb2.SystemSharedMemoryStatusRequest(), 10)
        return [name for name in status.regions if name.startswith(prefix)]

    if ending != "sigkill":
        assert registered() == []  # unregistered at exit, after an uncaught exception too
    else:
        assert registered() == report["regions"]  # SIGKILL: still registered...
        if sweeper == "sweep":
            assert set(report["regions"]) <= set(sweep_stale_regions(grpc))  # ...until swept
        else:
            with SystemShmTransport(ServerSettings(server.grpc_address)) as next_client:
                next_client.infer(request(10))  # ...until the next client's first registration
        assert registered() == []



FAKE_TRITON = r"""
# A fake Triton gRPC server (its own process: CUDA IPC handles open only in another process)
# that maps CUDA regions with cupy. Model "double": y = 2 * x (FP32 [rows, 4]); "slow": after 1.5 s.
import sys
import time
from concurrent import futures

import cupy
import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

regions = {}
in_use = {}


def array_at(name, offset, nbytes, shape, context):
    if name not in regions:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"Unable to find cuda shared memory region: '{name}'")
    pointer, size = regions[name]
    assert offset + nbytes <= size
    memory = cupy.cuda.UnownedMemory(pointer + offset, nbytes, owner=None)
    return cupy.ndarray(shape, cupy.float32, memptr=cupy.cuda.MemoryPointer(memory, 0))


class Fake(service_pb2_grpc.GRPCInferenceServiceServicer):
    def CudaSharedMemoryRegister(self, request, context):
        pointer = cupy.cuda.runtime.ipcOpenMemHandle(request.raw_handle)
        regions[request.name] = (pointer, request.byte_size)
        return service_pb2.CudaSharedMemoryRegisterResponse()

    def CudaSharedMemoryUnregister(self, request, context):
        if in_use.get(request.name):
            context.abort(grpc.StatusCode.INTERNAL, f"Cannot unregister shared memory region "
                          f"'{request.name}', it is currently in use.")
        entry = regions.pop(request.name, None)
        if entry is not None:
            cupy.cuda.runtime.ipcCloseMemHandle(entry[0])
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    def CudaSharedMemoryStatus(self, request, context):
        response = service_pb2.CudaSharedMemoryStatusResponse()
        for name, (_, size) in regions.items():
            response.regions[name].name = name
            response.regions[name].byte_size = size
        return response

    def ModelInfer(self, request, context):
        x_tensor = request.inputs[0]
        shape = tuple(x_tensor.shape)
        nbytes = int(np.prod(shape)) * 4
        params = x_tensor.parameters
        response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1")
        out = response.outputs.add(name="y", datatype="FP32", shape=shape)
        if "shared_memory_region" in params:
            name = params["shared_memory_region"].string_param
            in_use[name] = in_use.get(name, 0) + 1
            try:
                x = array_at(name, params["shared_memory_offset"].int64_param, nbytes, shape, context)
                if request.model_name == "slow":
                    time.sleep(1.5)
                o = request.outputs[0].parameters
                y = array_at(o["shared_memory_region"].string_param,
                             o["shared_memory_offset"].int64_param, nbytes, shape, context)
                y[...] = 2 * x
                cupy.cuda.Device().synchronize()
            finally:
                in_use[name] -= 1
        else:
            if request.model_name == "slow":
                time.sleep(1.5)
            x = np.frombuffer(request.raw_input_contents[0], np.float32).reshape(shape)
            response.raw_output_contents.append((2 * x).tobytes())
        return response


server = grpc.server(futures.ThreadPoolExecutor(8))
service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Fake(), server)
server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
server.start()
print("fake triton ready", flush=True)
server.wait_for_termination()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not CudaShmTransport.available() or importlib.util.find_spec("cupy") is None,
                    reason="needs torch with a CUDA GPU, and cupy for the fake server")
def test_cuda_transport_against_a_fake_triton_using_cuda_ipc(tmp_path):
    """The CUDA path end to end on a GPU without a GPU tritonserver (run on an H200, 2026-11-26)."""
    import sys

    import torch
    from tritonclient.grpc import service_pb2

    from coffea_sonic.core.tensors import TensorInfo

    out_spec = (TensorInfo("y", "FP32", (4,)),)
    port = free_port()
    fake = subprocess.Popen([sys.executable, "-c", FAKE_TRITON, str(port)])
    try:
        cuda = CudaShmTransport(f"127.0.0.1:{port}")
        x = torch.randn(1000, 4, device="cuda")
        got = wait_for(lambda: cuda.infer_tensors("double", "", {"x": x}, out_spec), 60,
                       "the fake server", ignoring=(TransportError,))
        assert got["y"].is_cuda and torch.equal(got["y"], 2 * x) and len(cuda.regions()) == 1
        host = np.random.default_rng(1).normal(size=(500, 4)).astype(np.float32)
        out = np.full((500, 4), np.nan, np.float32)
        answer = cuda.infer(InferRequest("double", "", {"x": host}, out_spec, rows=500,
                                         out={"y": out}))
        assert answer.delivered == {"y"} and answer.outputs["y"] is out
        assert np.array_equal(out, 2 * host)
        on_gpu = torch.empty(300, 4, device="cuda")
        answer = cuda.infer(InferRequest("double", "", {"x": x[:500]}, out_spec, rows=500,
                                         out={"y": on_gpu}))
        assert answer.delivered == {"y"} and torch.equal(on_gpu, 2 * x[:300])
        answer = cuda.infer(InferRequest("double", "", {"x": host}, out_spec, rows=500))
        assert np.array_equal(answer.outputs["y"], 2 * host)
        assert cuda.pool.stats["regions_made"] == 1
        (name,) = cuda.regions()
        cuda.grpc.rpc("CudaSharedMemoryUnregister",
                      service_pb2.CudaSharedMemoryUnregisterRequest(name=name), 5)
        error = cuda.submit(InferRequest("double", "", {"x": host}, out_spec, rows=500)).exception(30)
        assert isinstance(error, TransportError) and error.kind == "shm_region", error
        assert name not in cuda.regions()
        with CudaShmTransport(f"127.0.0.1:{port}", max_slots=1) as one:
            first = one.submit(InferRequest("slow", "", {"x": host}, out_spec, rows=500))
            second = one.submit(InferRequest("slow", "", {"x": host}, out_spec, rows=500))
            assert np.array_equal(second.result(30).outputs["y"], 2 * host)
            assert np.array_equal(first.result(30).outputs["y"], 2 * host)
            assert one.stats["inline_requests"] == 1
            # a request cancelled in flight runs to its answer (the fake is done with the
            # slot, 1.5 s), then gives its slot back clean: the next request goes through it
            doomed = one.submit(InferRequest("slow", "", {"x": host}, out_spec, rows=500))
            assert doomed.cancel() and doomed.cancelled()
            sent = one.stats["shm_requests"]

            def reused() -> bool:
                answer = one.infer(InferRequest("double", "", {"x": host}, out_spec, rows=500))
                assert np.array_equal(answer.outputs["y"], 2 * host)
                return one.stats["shm_requests"] > sent

            wait_for(reused, 30, "the cancelled request's slot reused")
            assert one.pool.stats["regions_dropped"] == 0 and not one.pool.pending()
            assert one.pool.stats["regions_made"] == 1 and len(one.regions()) == 1
        cuda.close()
        status = cuda.grpc.rpc("CudaSharedMemoryStatus",
                               service_pb2.CudaSharedMemoryStatusRequest(), 5)
        assert list(status.regions) == [] and cuda.regions() == []
    finally:
        fake.kill()
        fake.wait(10)


def _tritonserver_found() -> bool:
    from coffea_sonic.errors import MissingDependencyError
    from coffea_sonic.server.launcher import server_binary

    try:
        server_binary()
    except MissingDependencyError:
        return False
    return True


@pytest.mark.gpu
@pytest.mark.skipif(not CudaShmTransport.available() or not _tritonserver_found(),
                    reason="needs torch with a CUDA GPU and a tritonserver")
def test_cuda_tensors_through_a_gpu_tritonserver_answer_as_plain_grpc():
    """Torch CUDA tensors in and out of a GPU tritonserver (``infer_tensors``), as gRPC answers."""
    import torch

    with LocalTritonServer(models=["emtrk_cnn", MODEL], device="gpu") as gpu_server:
        with CudaShmTransport(gpu_server.grpc_address) as cuda:
            for name, rows in (("emtrk_cnn", 64), (MODEL, 1000)):
                inputs = zoo.example_inputs(name, rows, seed=9)
                expected = grpc_reference(gpu_server.grpc_address, name, inputs)
                on_gpu = {key: torch.from_numpy(value).cuda() for key, value in inputs.items()}
                got = cuda.infer_tensors(name, "", on_gpu, zoo.spec(name).outputs)
                assert sorted(got) == sorted(expected)
                for key, want in expected.items():
                    # bit for bit: the zoo's TorchScript models run unfused (see
                    # benchmarks/transport/RESULTS-transport.md, "Outputs")
                    assert got[key].is_cuda and np.array_equal(got[key].cpu().numpy(), want), key
                host = cuda.infer_tensors(name, "", on_gpu, zoo.spec(name).outputs, as_numpy=True)
                assert all(isinstance(array, np.ndarray) for array in host.values())
            assert cuda.stats["shm_requests"] == 4 and cuda.stats["inline_requests"] == 0
            assert cuda.regions()
        assert cuda.regions() == []
