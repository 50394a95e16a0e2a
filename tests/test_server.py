"""The embedded real tritonserver: start-up, readiness, metadata, shutdown hygiene, failures."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from coffea_sonic import zoo
from coffea_sonic.engines import CpuEngine
from coffea_sonic.errors import ServerStartError
from coffea_sonic.server import LocalTritonServer, parse_config, write_repository


def _children(pid: int) -> list[int]:
    """PIDs of processes whose session is ``pid`` (the server and its python-backend stubs)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == pid:  # field 6 of stat: session id
            found.append(int(stat.split("/")[2]))
    return found


def _raw_infer(client, name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One request per max_batch_size slice with the stock client (independent of TritonModel)."""
    model_spec = zoo.spec(name)
    rows = next(iter(inputs.values())).shape[0]
    pieces: dict[str, list[np.ndarray]] = {n: [] for n in model_spec.output_names}
    for start in range(0, rows, model_spec.max_batch_size):
        request = []
        for key, value in inputs.items():
            part = np.ascontiguousarray(value[start:start + model_spec.max_batch_size])
            tensor = grpcclient.InferInput(key, part.shape, "FP32")
            tensor.set_data_from_numpy(part)
            request.append(tensor)
        result = client.infer(name, request)
        for output in model_spec.output_names:
            pieces[output].append(result.as_numpy(output))
    return {key: np.concatenate(value) for key, value in pieces.items()}


def test_serve_command_is_ready_quickly_with_all_models_and_stops_on_sigterm(tmp_path):
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "coffea_sonic.cli", "serve", "--device", "cpu", "--grpc-port", "0",
         "--http-port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        ready_after = time.monotonic() - started
        assert ready_after < 15, f"serve took {ready_after:.1f} s to be ready:\n{''.join(lines)}"
        address = next(line.split()[1] for line in lines if line.strip().startswith("gRPC"))
        client = grpcclient.InferenceServerClient(address)
        for name in zoo.names():
            assert client.is_model_ready(name)
            metadata = client.get_model_metadata(name, as_json=True)
            model_spec = zoo.spec(name)
            served_inputs = {t["name"]: (t["datatype"], [int(d) for d in t["shape"]])
                             for t in metadata["inputs"]}
            declared = {t.name: ("FP32", [-1, *t.dims]) for t in model_spec.inputs}
            assert served_inputs == declared
            served_outputs = {t["name"]: [int(d) for d in t["shape"]] for t in metadata["outputs"]}
            assert served_outputs == {t.name: [-1, *t.dims] for t in model_spec.outputs}
        client.close()
        server_pid = int(next(l for l in lines if "pid" in l).rsplit("pid", 1)[1].strip(" )\n"))
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    assert process.returncode == 0
    assert not _children(server_pid)


@pytest.mark.parametrize("name", zoo.names())
def test_served_outputs_equal_cpu_engine_on_1_7_and_more_than_max_batch_rows(triton_server, name):
    client = grpcclient.InferenceServerClient(triton_server.grpc_address)
    engine = CpuEngine(name)
    for rows in (1, 7, zoo.spec(name).max_batch_size + 1):
        inputs = zoo.example_inputs(name, rows, seed=rows)
        served = _raw_infer(client, name, inputs)
        local = engine(inputs)
        for output in zoo.spec(name).output_names:
            assert served[output].shape == local[output].shape
            assert np.max(np.abs(served[output] - local[output])) <= 1e-5, (name, rows, output)
    client.close()


def test_two_servers_on_free_ports_leave_no_process_or_shm_region_after_stop():
    first = LocalTritonServer(models=["jet_tagger"], device="cpu").start()
    second = LocalTritonServer(models=["jet_tagger"], device="cpu").start()
    try:
        assert first.grpc_address != second.grpc_address
        sessions = {first.pid: _children(first.pid), second.pid: _children(second.pid)}
        assert all(len(pids) >= 2 for pids in sessions.values()), "server + stub expected"
        for server in (first, second):
            client = grpcclient.InferenceServerClient(server.grpc_address)
            assert client.is_model_ready("jet_tagger")
            client.close()
        assert glob.glob(f"/dev/shm/{first.shm_prefix}*"), "python backend should use shm"
    finally:
        first.stop()
        second.stop()
    for server, pids in sessions.items():
        assert not _children(server)
        assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    assert not glob.glob(f"/dev/shm/{first.shm_prefix}*")
    assert not glob.glob(f"/dev/shm/{second.shm_prefix}*")


def test_broken_repository_fails_fast_with_the_servers_own_error(tmp_path):
    repository = write_repository(tmp_path / "repo", ["jet_tagger"])
    config = repository / "jet_tagger" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size", "max_batch_sise"))
    started = time.monotonic()
    with pytest.raises(ServerStartError) as error:
        LocalTritonServer(repository=repository, device="cpu").start()
    assert time.monotonic() - started < 30
    assert "max_batch_sise" in str(error.value)  # the server's own parse error text


@pytest.mark.parametrize("backend", ["python", "onnxruntime"])
@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_exported_configs_parse_with_tritons_model_config_schema(tmp_path, backend, device):
    if backend == "python" and device == "gpu":
        pytest.importorskip("torch")
    command = [sys.executable, "-m", "coffea_sonic.cli", "models", "export", str(tmp_path),
               "--backend", backend, "--device", device]
    subprocess.run(command, check=True, capture_output=True)
    for name in zoo.names():
        config = parse_config(tmp_path / name / "config.pbtxt")
        assert config.name == name
        assert [t.name for t in config.input] == list(zoo.spec(name).input_names)
        assert list(config.dynamic_batching.preferred_batch_size)
        assert (tmp_path / name / "1" / "model.onnx").exists() or device == "gpu"
        if backend == "python" and device == "gpu":
            assert (tmp_path / name / "1" / "model.pt").exists()


def test_gpu_engine_matches_cpu_engine_where_a_gpu_exists():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine (runs on the GPU machine, see benchmarks/)")
    from coffea_sonic.engines import GpuEngine

    for name in zoo.names():
        inputs = zoo.example_inputs(name, 64)
        gpu, cpu = GpuEngine(name)(inputs), CpuEngine(name)(inputs)
        for key in cpu:
            assert np.max(np.abs(gpu[key] - cpu[key])) <= 1e-4


def test_server_dies_with_the_process_that_started_it(tmp_path):
    script = ("import sys, time\n"
              "from coffea_sonic.server import LocalTritonServer\n"
              "s = LocalTritonServer(models=['jet_tagger'], device='cpu').start()\n"
              "print(s.pid, s.shm_prefix, flush=True)\n"
              "time.sleep(600)\n")
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    server_pid, prefix = client.stdout.readline().split()
    os.kill(client.pid, signal.SIGKILL)  # no atexit, no finalizer: only the kernel can tell
    client.wait()
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{server_pid}") and time.monotonic() < deadline:
        time.sleep(0.2)
    status = Path(f"/proc/{server_pid}/status")
    assert not status.exists() or "zombie" in status.read_text()
    # the next server started anywhere on the machine removes the orphaned regions
    with LocalTritonServer(models=["jet_tagger"], device="cpu"):
        assert not glob.glob(f"/dev/shm/{prefix}*")
