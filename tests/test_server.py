"""The embedded real tritonserver: start-up, readiness, metadata, shutdown hygiene, failures."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from coffea_sonic import zoo
from coffea_sonic.engines import CpuEngine
from coffea_sonic.errors import ConfigurationError, ServerStartError
from coffea_sonic.server import LocalTritonServer, parse_config, write_repository
from helpers import CheckedThread, wait_for


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


def _raw_infer(client, name: str, inputs: dict[str, np.ndarray],
               zoo_name: str | None = None) -> dict[str, np.ndarray]:
    """One request per max_batch_size slice with the stock client (independent of TritonModel);
    ``zoo_name``: the zoo model that ``name`` serves (default: ``name``)."""
    model_spec = zoo.spec(zoo_name or name)
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


def test_serve_command_becomes_ready_with_all_models_and_stops_on_sigterm(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "coffea_sonic.cli", "serve", "--device", "cpu", "--grpc-port", "0",
         "--http-port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []

    def read_output() -> None:
        for line in process.stdout:  # until serve exits and its stdout closes
            lines.append(line)

    reader = CheckedThread(read_output)
    reader.start()
    try:
        # No start-up time limit (a loaded machine is slow, not broken): wait for serve to say it
        # is ready, then for the server itself to answer that it is.
        wait_for(lambda: process.poll() is not None
                 or any(line.startswith("Press Ctrl-C") for line in lines),
                 timeout=300, interval=0.1, what=lambda: "serve to report readiness; its output "
                 f"so far:\n{''.join(lines)}")
        assert process.poll() is None, f"serve exited early:\n{''.join(lines)}"
        address = next(line.split()[1] for line in lines if line.strip().startswith("gRPC"))
        client = grpcclient.InferenceServerClient(address)
        wait_for(client.is_server_ready, timeout=60, what=f"the server at {address} to be ready",
                 ignoring=(InferenceServerException,))
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
        reader.finish(timeout=30)
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


def _stub_proc(server: LocalTritonServer, model: str) -> Path:
    """/proc of the python-backend stub that serves ``model``."""
    for pid in _children(server.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"triton_python_backend_stub" in command[0] and f"/{model}/1/model.py".encode() in command[1]:
            return Path(f"/proc/{pid}")
    raise AssertionError(f"no python-backend stub of {model} in {server}")


def _stub_rss_mb(server: LocalTritonServer, model: str) -> float:
    resident_pages = int((_stub_proc(server, model) / "statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_a_cpu_model_gives_back_a_large_batchs_memory(triton_server):
    """A CPU stub that kept the largest batch's activations (GBs for the CNN at its
    max_batch_size) would hold them for the server's life: between runs it holds at most
    ``arena_keep_mib`` (1 GiB by default)."""
    client = grpcclient.InferenceServerClient(triton_server.grpc_address)
    spec = zoo.spec("emtrk_cnn")
    for rows in (spec.preferred_batch_sizes[-1], spec.max_batch_size):
        _raw_infer(client, "emtrk_cnn", zoo.example_inputs("emtrk_cnn", rows, seed=1))
        held = _stub_rss_mb(triton_server, "emtrk_cnn")
        assert held <= 1024, f"the emtrk_cnn stub holds {held:.0f} MB after a batch of {rows} rows"
    client.close()


def _stub_minor_faults(server: LocalTritonServer, model: str) -> int:
    stat = (_stub_proc(server, model) / "stat").read_text().rsplit(")", 1)[1].split()
    return int(stat[7])  # minflt


def test_a_cpu_model_under_its_memory_bound_reuses_its_pages_run_after_run(tmp_path):
    """Runs of the usual size keep the arena's memory while the stub stays under
    ``arena_keep_mib``: a run then writes into pages it already has, where a stub that gives its
    memory back after every run (``arena_keep_mib: 0``) faults them in again each time."""
    write_repository(tmp_path, ["jet_tagger"], device="cpu")
    trimmed = tmp_path / "jet_tagger_trimmed"
    shutil.copytree(tmp_path / "jet_tagger", trimmed)
    config = (trimmed / "config.pbtxt").read_text().replace('name: "jet_tagger"',
                                                             'name: "jet_tagger_trimmed"')
    (trimmed / "config.pbtxt").write_text(
        config + 'parameters {\n  key: "arena_keep_mib"\n  value {\n    string_value: "0"\n  }\n}\n')
    inputs = zoo.example_inputs("jet_tagger", 20000, seed=2)
    expected = CpuEngine("jet_tagger")(inputs)
    faults = {}
    with LocalTritonServer(repository=tmp_path, device="cpu") as server:
        client = grpcclient.InferenceServerClient(server.grpc_address)
        for model in ("jet_tagger", "jet_tagger_trimmed"):
            for _ in range(2):
                _raw_infer(client, model, inputs, "jet_tagger")
            before = _stub_minor_faults(server, model)
            for _ in range(4):
                served = _raw_infer(client, model, inputs, "jet_tagger")
                for name, want in expected.items():
                    assert np.max(np.abs(served[name] - want)) <= 1e-5, (model, name)
            faults[model] = (_stub_minor_faults(server, model) - before) / 4
        client.close()
    assert faults["jet_tagger_trimmed"] > 1000, faults  # the pages it gives back and takes again
    assert faults["jet_tagger"] < faults["jet_tagger_trimmed"] / 4, faults


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


@pytest.mark.parametrize("kind", ["grpc", "metrics"])
def test_picked_port_taken_before_the_server_binds_it_is_replaced(monkeypatch, kind):
    import socket

    from coffea_sonic.server import launcher

    picks = iter(range(3))
    real_free_port = launcher.free_port
    with socket.socket() as squatter:  # another process wins the race for the picked port
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        position = ["grpc", "http", "metrics"].index(kind)  # the order start() picks them in
        monkeypatch.setattr(launcher, "free_port", lambda host="127.0.0.1": (
            taken if next(picks, None) == position else real_free_port(host)))
        with LocalTritonServer(models=["jet_tagger"], device="cpu") as server:
            assert server.ports[kind] != taken
            client = grpcclient.InferenceServerClient(server.grpc_address)
            assert client.is_model_ready("jet_tagger")
            client.close()
            with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
                assert b"nv_inference_count" in response.read()


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
    command = [sys.executable, "-m", "coffea_sonic.cli", "models", "export", "-o", str(tmp_path),
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

    def server_gone() -> bool:
        try:
            return "zombie" in Path(f"/proc/{server_pid}/status").read_text()
        except FileNotFoundError:
            return True

    wait_for(server_gone, timeout=30, interval=0.2,
             what=f"server {server_pid} to exit after the process that started it was killed")
    # the next server started anywhere on the machine removes the orphaned regions
    with LocalTritonServer(models=["jet_tagger"], device="cpu"):
        assert not glob.glob(f"/dev/shm/{prefix}*")


def test_gpus_restrict_what_the_server_sees():
    with pytest.raises(ConfigurationError, match="GPU indices"):
        LocalTritonServer(models=["jet_tagger"], gpus=[])
    with LocalTritonServer(models=["jet_tagger"], device="cpu", gpus=[1, 3]) as server:
        environment = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=1,3" in environment


@pytest.mark.gpu
def test_default_gpu_server_uses_every_visible_gpu_and_gpus_selects():
    from coffea_sonic.server.launcher import gpu_available

    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    count = sum(line.startswith("GPU ") for line in listed.splitlines())
    with LocalTritonServer(models=["jet_tagger"], device="gpu", instances=1) as server:
        log = server.log_path.read_text(errors="replace")
        assert all(f"(GPU device {index})" in log for index in range(count)), log[-2000:]
    if count > 1:
        with LocalTritonServer(models=["jet_tagger"], device="gpu", instances=1,
                               gpus=[count - 1]) as server:
            log = server.log_path.read_text(errors="replace")
            assert "(GPU device 0)" in log and "(GPU device 1)" not in log, log[-2000:]


def test_stopping_a_reaped_server_spares_the_group_that_now_has_its_pid(monkeypatch):
    """Once a dead server is reaped its pid can be handed to a new process (pid_max may be
    32768): a late stop must not SIGKILL that process's group (another test's server)."""
    from coffea_sonic.server import process as server_process

    finished = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    finished.wait()
    killed = []
    monkeypatch.setattr(server_process.os, "killpg", lambda pgid, sig: killed.append((pgid, sig)))
    real_exists = server_process.os.path.exists
    monkeypatch.setattr(server_process.os.path, "exists",
                        lambda path: path == f"/proc/{finished.pid}" or real_exists(path))
    server_process.stop_process_group(finished, grace_s=1)
    assert killed == []
    monkeypatch.setattr(server_process.os.path, "exists", real_exists)
    server_process.stop_process_group(finished, grace_s=1)  # pid free: the group is ours
    assert killed == [(finished.pid, signal.SIGKILL)]
