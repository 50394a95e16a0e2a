"""Transport benchmark: rows/s and GB/s of tensor payload, per transport, client processes and server.

Runs a real tritonserver (the embedded one, or the GPU machine's via the ``TRITON*`` environment of
``triton-gpu-env.sh``) twice: with the earlier server model
(``model_before.py.tmpl``, one instance) and as it is now (``coffea_sonic/server/model.py.tmpl``,
``--instances`` per device). Client processes (spawned, so nothing gRPC crosses a fork) send
back-to-back requests of a fixed batch for ``--duration`` seconds, all starting together; the
aggregate is rows answered inside that window. Transports:

=================  ==================================================================================
``tritonclient``   stock ``tritonclient.grpc.InferenceServerClient.infer`` (the naive "before" client)
``grpc``           :class:`coffea_sonic.transport.grpc.GrpcTransport` (TritonModel's remote wire)
``grpc-framed``    prototype: minimal-copy framing of the same gRPC request, 4 connections
``http``           :class:`coffea_sonic.transport.http.HttpTransport` (binary tensors, no copy)
``shm``            :class:`coffea_sonic.transport.shm.SystemShmTransport`
``cuda``           :class:`coffea_sonic.transport.shm.CudaShmTransport`, inputs already on the GPU
``local``          in-process engine (GpuEngine incl. host<->device copies, or CpuEngine)
``local-resident`` in-process torch with inputs already on the GPU (compute only, for the profile)
=================  ==================================================================================

The transports get one :class:`~coffea_sonic.transport.base.InferRequest` per request, as
TritonModel sends them. During each served run: GPU utilisation (``nvidia-smi`` every 100 ms,
:class:`coffea_sonic.bench.probes.GpuUtilisation`) and Triton's statistics (queue, compute
input/infer/output per request, average batch, busy fraction; read through the transport layer by
:func:`coffea_sonic.bench.probes.server_statistics`).

    python benchmarks/transport/bench_transport.py --plan cpu --out benchmarks/transport
    python benchmarks/transport/bench_transport.py --plan gpu --out $OUT     # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from coffea_sonic.bench import modes
from coffea_sonic.bench.client import max_abs_difference
from coffea_sonic.bench.clients import ClientPool

from coffea_sonic.bench.slice_model import SINK_NAME
from coffea_sonic.bench.slice_model import write_payload_sink as write_sink


HERE = Path(__file__).resolve().parent
logger = logging.getLogger("bench_transport")

#: The declared outputs of the sink (``TensorInfo`` made lazily: see :func:`output_specs`).
SINK_OUTPUTS = [("first", "FP32", (1,))]

# -- plans -------------------------------------------------------------------------------------------
# (phase, kind, model, rows, procs, in_flight)
PLANS: dict[str, list[tuple]] = {
    "quick": [
        ("before", "tritonclient", "jet_tagger", 4096, 1, 1),
        ("after", "verify", "jet_tagger", 4096, 1, 1),
        ("after-i3", "shm", "jet_tagger", 4096, 2, 2),
        ("after", "shm", "jet_tagger", 4096, 1, 2),
        ("after", "http", SINK_NAME, 512, 1, 1),
        ("after", "grpc-framed", SINK_NAME, 512, 1, 2),
        ("after", "local", "jet_tagger", 4096, 1, 1),
    ],
    "cpu": [
        ("after", "local", "jet_tagger", 16384, 1, 1),
        ("after", "local", "emtrk_cnn", 256, 1, 1),
        ("before", "tritonclient", "jet_tagger", 16384, 1, 1),
        ("before", "tritonclient", "jet_tagger", 16384, 2, 1),
        ("before", "tritonclient", "emtrk_cnn", 256, 1, 1),
        ("after", "grpc", "jet_tagger", 16384, 1, 2),
        ("after", "shm", "jet_tagger", 16384, 1, 2),
        ("after", "shm", "jet_tagger", 16384, 2, 2),
        ("after", "shm", "emtrk_cnn", 256, 1, 2),
        ("after", "tritonclient", SINK_NAME, 2048, 1, 1),
        ("after", "grpc", SINK_NAME, 2048, 1, 2),
        ("after", "grpc-framed", SINK_NAME, 2048, 1, 2),
        ("after", "http", SINK_NAME, 2048, 1, 2),
        ("after", "shm", SINK_NAME, 2048, 1, 2),
        ("after", "grpc", SINK_NAME, 512, 1, 4),
        ("after", "grpc-framed", SINK_NAME, 512, 1, 4),
        ("after", "http", SINK_NAME, 512, 1, 4),
        ("after", "grpc", SINK_NAME, 2048, 2, 2),
        ("after", "http", SINK_NAME, 2048, 2, 2),
        ("after", "shm", SINK_NAME, 2048, 2, 2),
    ],
    # second H100 run: the recommended server (--instances 4), unoptimised TorchScript (served ==
    # in-process check), the network path at smaller requests, and the remaining knobs
    "gpu2": [
        ("after", "verify", "emtrk_cnn", 2048, 1, 1),
        ("after", "verify", "jet_tagger", 16384, 1, 1),
        ("after", "local", "emtrk_cnn", 2048, 1, 1),
        ("after", "local", "jet_tagger", 65536, 1, 1),
        ("after", "shm", "emtrk_cnn", 2048, 8, 2),
        ("after", "shm", "emtrk_cnn", 2048, 16, 2),
        ("after", "cuda", "emtrk_cnn", 2048, 8, 2),
        ("after", "grpc", "emtrk_cnn", 2048, 8, 2),
        ("after", "grpc-framed", "emtrk_cnn", 2048, 8, 2),
        ("after", "shm", "jet_tagger", 65536, 12, 2),
        ("after", "shm", "jet_tagger", 65536, 16, 2),
        ("after", "grpc", "jet_tagger", 65536, 12, 2),
        ("after", "tritonclient", SINK_NAME, 256, 1, 1),
        ("after", "grpc", SINK_NAME, 256, 1, 4),
        ("after", "grpc-framed", SINK_NAME, 256, 1, 4),
        ("after", "http", SINK_NAME, 256, 1, 4),
        ("after", "grpc", SINK_NAME, 512, 1, 4),
        ("after", "grpc-framed", SINK_NAME, 512, 1, 4),
        ("after", "http", SINK_NAME, 512, 1, 4),
        ("after", "grpc-framed", SINK_NAME, 2048, 1, 4),
        ("after", "shm", SINK_NAME, 512, 1, 2),
        ("after", "shm", SINK_NAME, 2048, 1, 2),
        ("after-i3", "shm", "emtrk_cnn", 2048, 8, 2),
        ("after-pageable", "shm", "emtrk_cnn", 2048, 8, 2),
        ("after-gpuin", "verify", "emtrk_cnn", 512, 1, 1),
        ("after-gpuin", "cuda", "emtrk_cnn", 2048, 8, 2),
    ],
    "gpu": [
        # in-process baselines on the same GPU; served == in-process check
        ("after", "verify", "emtrk_cnn", 2048, 1, 1),
        ("after", "verify", "jet_tagger", 16384, 1, 1),
        ("after", "local", "emtrk_cnn", 2048, 1, 1),
        ("after", "local-resident", "emtrk_cnn", 2048, 1, 1),
        ("after", "local", "jet_tagger", 16384, 1, 1),
        ("after", "local", "jet_tagger", 65536, 1, 1),
        ("after", "local-resident", "jet_tagger", 65536, 1, 1),
        # before: stock client, old model.py, one instance
        ("before", "tritonclient", "emtrk_cnn", 2048, 1, 1),
        ("before", "tritonclient", "emtrk_cnn", 2048, 8, 1),
        ("before", "shm", "emtrk_cnn", 2048, 8, 2),
        ("before", "tritonclient", "jet_tagger", 16384, 1, 1),
        ("before", "tritonclient", "jet_tagger", 16384, 8, 1),
        ("before", "shm", "jet_tagger", 16384, 8, 2),
        # after: payload bandwidth of one process (transport-only model)
        ("after", "tritonclient", SINK_NAME, 2048, 1, 1),
        ("after", "grpc", SINK_NAME, 2048, 1, 2),
        ("after", "http", SINK_NAME, 2048, 1, 2),
        ("after", "http", SINK_NAME, 2048, 1, 4),
        ("after", "shm", SINK_NAME, 2048, 1, 2),
        ("after", "shm", SINK_NAME, 2048, 1, 4),
        # after: emtrk_cnn
        ("after", "grpc", "emtrk_cnn", 2048, 8, 2),
        ("after", "http", "emtrk_cnn", 2048, 8, 2),
        ("after", "shm", "emtrk_cnn", 2048, 1, 2),
        ("after", "shm", "emtrk_cnn", 2048, 4, 2),
        ("after", "shm", "emtrk_cnn", 2048, 8, 2),
        ("after", "shm", "emtrk_cnn", 2048, 12, 2),
        ("after", "cuda", "emtrk_cnn", 2048, 1, 2),
        ("after", "cuda", "emtrk_cnn", 2048, 4, 2),
        # after: jet_tagger
        ("after", "grpc", "jet_tagger", 16384, 8, 2),
        ("after", "shm", "jet_tagger", 16384, 1, 2),
        ("after", "shm", "jet_tagger", 16384, 8, 2),
        ("after", "shm", "jet_tagger", 65536, 8, 2),
        ("after", "shm", "jet_tagger", 65536, 12, 2),
        # instances per GPU: 1 (today's model.py alone) and 4
        ("after-i1", "shm", "emtrk_cnn", 2048, 8, 2),
        ("after-i4", "shm", "emtrk_cnn", 2048, 8, 2),
        ("after-i4", "shm", "emtrk_cnn", 2048, 12, 2),
        ("after-i4", "shm", "jet_tagger", 65536, 12, 2),
        # GPU inputs handed to the model through DLPack (FORCE_CPU_ONLY_INPUT_TENSORS: no)
        ("after-gpuin", "verify", "emtrk_cnn", 256, 1, 1),
        ("after-gpuin", "cuda", "emtrk_cnn", 2048, 4, 2),
    ],
}


def row_bytes(model: str) -> int:
    """Input bytes of one row (the sink takes emtrk_cnn's rows)."""
    return modes.row_bytes("emtrk_cnn" if model == SINK_NAME else model)


def example(model: str, rows: int) -> dict[str, np.ndarray]:
    from coffea_sonic import zoo

    return zoo.example_inputs("emtrk_cnn" if model == SINK_NAME else model, rows, seed=1)


def output_specs(model: str) -> tuple:
    """The outputs ``model`` declares, as the transports take them (``TensorInfo``)."""
    from coffea_sonic import zoo
    from coffea_sonic.core.tensors import TensorInfo

    if model == SINK_NAME:
        return tuple(TensorInfo(*spec) for spec in SINK_OUTPUTS)
    return zoo.declared_info(model).outputs


# -- client worker processes -----------------------------------------------------------------------------

class _Client:
    """One way of sending requests: ``submit(inputs)`` -> object with ``result()``."""

    def __init__(self, kind: str, model: str, grpc_address: str, http_address: str) -> None:
        self.kind, self.model = kind, model
        self.specs = output_specs(model)
        if kind == "tritonclient":
            import tritonclient.grpc as grpcclient

            self.client = grpcclient.InferenceServerClient(grpc_address)
        elif kind == "grpc-framed":
            self.framed = FramedGrpc(grpc_address, channels=4)
        else:
            self.transport = make_transport(kind, grpc_address, http_address)

    def submit(self, inputs: dict) -> Any:
        if self.kind == "tritonclient":
            import tritonclient.grpc as grpcclient

            tensors = []
            for name, array in inputs.items():
                tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
                tensor.set_data_from_numpy(array)
                tensors.append(tensor)
            answer = self.client.infer(self.model, tensors)
            return _done({spec.name: answer.as_numpy(spec.name) for spec in self.specs})
        if self.kind == "grpc-framed":
            from coffea_sonic.transport.grpc.codec import decode_response

            return _Mapped(self.framed.submit(self.model, inputs), decode_response)
        from coffea_sonic.transport.base import InferRequest

        rows = int(next(iter(inputs.values())).shape[0])
        # a CUDA transport's submit answers host arrays, as TritonModel receives them
        future = self.transport.submit(InferRequest(self.model, "", inputs, self.specs, rows=rows,
                                                    timeout_s=120))
        return _Mapped(future, lambda answer: answer.outputs)


def make_transport(kind: str, grpc_address: str, http_address: str) -> Any:
    """The transport ``kind`` (grpc, http, shm, cuda) to the server, as TritonModel makes it."""
    from coffea_sonic.core.endpoint import ServerSettings

    if kind == "grpc":
        from coffea_sonic.transport.grpc import GrpcTransport

        return GrpcTransport(ServerSettings(grpc_address))
    if kind == "http":
        from coffea_sonic.transport.http import HttpTransport

        return HttpTransport(ServerSettings(http_address, protocol="http"), max_connections=8)
    if kind == "shm":
        from coffea_sonic.transport.shm import SystemShmTransport

        return SystemShmTransport(ServerSettings(grpc_address), max_slots=8)
    if kind == "cuda":
        from coffea_sonic.transport.shm import CudaShmTransport

        return CudaShmTransport(ServerSettings(grpc_address), max_slots=8)
    raise ValueError(f"unknown transport kind {kind!r}")


class FramedGrpc:
    """Prototype of the minimal-copy gRPC request: the protobuf header is serialised without the
    tensors, and the tensors are appended as ``raw_input_contents`` fields by hand, so a request
    costs one copy in Python (``b"".join``) instead of ``tobytes`` + protobuf serialisation; sent
    round-robin over ``channels`` separate HTTP/2 connections (Triton reads each connection on one
    thread)."""

    def __init__(self, address: str, channels: int = 4) -> None:
        import grpc
        from tritonclient.grpc import service_pb2

        from coffea_sonic.transport.grpc.channel import channel_options

        self.calls = []
        for index in range(channels):
            # a distinct argument per channel, so gRPC does not share one connection
            channel = grpc.insecure_channel(address, options=channel_options() + [
                ("grpc.primary_user_agent", f"csonic-framed-{index}")])
            self.calls.append(channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=lambda payload: payload,
                response_deserializer=service_pb2.ModelInferResponse.FromString))
        self.turn = 0

    @staticmethod
    def _varint(value: int) -> bytes:
        out = bytearray()
        while True:
            byte = value & 0x7F
            value >>= 7
            if value:
                out.append(byte | 0x80)
            else:
                out.append(byte)
                return bytes(out)

    def submit(self, model: str, inputs: dict) -> Any:
        from tritonclient.grpc import service_pb2

        from coffea_sonic.core.tensors import triton_dtype

        request = service_pb2.ModelInferRequest(model_name=model)
        parts: list = []
        for name, array in inputs.items():
            tensor = request.inputs.add()
            tensor.name, tensor.datatype = name, triton_dtype(array.dtype)
            tensor.shape.extend(array.shape)
            data = memoryview(np.ascontiguousarray(array)).cast("B")
            parts += [b"\x3a", self._varint(data.nbytes), data]  # field 7, length-delimited
        payload = b"".join([request.SerializeToString(), *parts])
        call = self.calls[self.turn % len(self.calls)]
        self.turn += 1
        return call.future(payload, timeout=120)


def _done(value: Any) -> Future:
    """A future that already holds ``value`` (answers computed in the calling thread)."""
    future: Future = Future()
    future.set_result(value)
    return future


class _Mapped:
    def __init__(self, future: Any, convert) -> None:
        self.future, self.convert = future, convert

    def result(self) -> Any:
        return self.convert(self.future.result())


class _Local:
    """In-process engine with the same submit/result shape."""

    def __init__(self, kind: str, model: str, device: str) -> None:
        from coffea_sonic.engines import CpuEngine, GpuEngine

        self.kind = kind
        if device == "gpu":
            self.engine = GpuEngine(model)
        else:
            self.engine = CpuEngine(model)
        self.device = device

    def prepare(self, inputs: dict) -> Any:
        if self.kind == "local-resident":
            import torch

            return [torch.from_numpy(inputs[t.name]).cuda() for t in self.engine.model_spec.inputs]
        return inputs

    def submit(self, prepared: Any) -> Any:
        if self.kind == "local-resident":
            import torch

            with torch.inference_mode():
                values = self.engine.module(*prepared)
                torch.cuda.synchronize()
            return _done(values)
        return _done(self.engine(prepared))


def _verify(task: dict) -> dict:
    """max |served - in-process| for each transport on the same inputs (and vs each other)."""
    kind_outputs: dict[str, dict] = {}
    model, rows = task["model"], task["rows"]
    inputs = example(model, rows)
    if task["device"] == "gpu":
        from coffea_sonic.engines import GpuEngine

        kind_outputs["local"] = GpuEngine(model)(inputs)
    for kind in ("grpc", "http", "shm") + (("cuda",) if task["device"] == "gpu" else ()):
        client = _Client(kind, model, task["grpc"], task["http"])
        given = inputs
        if kind == "cuda":
            import torch

            given = {name: torch.from_numpy(array).cuda() for name, array in inputs.items()}
        kind_outputs[kind] = client.submit(given).result()
    reference = kind_outputs["grpc"]
    return {f"{kind}-vs-grpc": max_abs_difference(
        {name: np.asarray(array) for name, array in outputs.items()}, reference)
        for kind, outputs in kind_outputs.items()}


def _run_task(task: dict, clients: dict, control) -> dict:
    kind, model, rows, in_flight = task["kind"], task["model"], task["rows"], task["in_flight"]
    if kind == "verify":
        diffs = _verify(task)
        control.put(("ready", os.getpid()))
        task["go"].get()
        return {"rows": 0, "requests": 0, "submit_s": 0.0, "verify": diffs}
    key = (kind, model, task["grpc"])
    if key not in clients:
        if kind.startswith("local"):
            clients[key] = _Local(kind, model, task["device"])
        else:
            clients[key] = _Client(kind, model, task["grpc"], task["http"])
    client = clients[key]
    inputs = example(model, rows)
    if kind == "cuda":
        import torch

        inputs = {name: torch.from_numpy(array).cuda() for name, array in inputs.items()}
    if kind.startswith("local"):
        inputs = client.prepare(inputs)
    for _ in range(2):  # warm-up: connections, regions, kernels
        client.submit(inputs).result()
    control.put(("ready", os.getpid()))
    start_at = task["go"].get()
    while time.time() < start_at:
        time.sleep(0.0005)
    end = start_at + task["duration"]
    pending: deque = deque()
    done_rows = requests = 0
    submit_s = 0.0
    latencies = []
    while True:
        now = time.time()
        if now >= end and not pending:
            break
        if now < end and len(pending) < in_flight:
            sent = time.time()
            began = time.perf_counter()
            handle = client.submit(inputs)
            submit_s += time.perf_counter() - began
            pending.append((handle, sent))
            continue
        handle, sent = pending.popleft()
        handle.result()
        finished = time.time()
        if finished <= end:
            done_rows += rows
            requests += 1
            latencies.append(finished - sent)
    return {"rows": done_rows, "requests": requests, "submit_s": submit_s,
            "latency_ms_p50": 1e3 * float(np.median(latencies)) if latencies else None,
            "stats": dict(getattr(getattr(client, "transport", None), "stats", {}) or {})}


def _task(task: dict, tasks, control, clients: dict) -> dict:
    """A client process's run (see coffea_sonic.bench.clients.ClientPool)."""
    task["go"] = tasks
    return _run_task(task, clients, control)


# -- probes (coffea_sonic.bench.probes: the harness' GPU sampler and statistics reader) ----------------

# -- servers ------------------------------------------------------------------------------------------

PHASE_ORDER = ("before", "after-i1", "after-i2", "after", "after-i3", "after-i4", "after-pageable",
               "after-gpuin")


def phase_instances(phase: str, default: int) -> int:
    """Model instances of a phase: ``before`` 1, ``after`` the default, ``after-iN`` N."""
    import re

    if phase == "before":
        return 1
    match = re.search(r"-i(\d+)", phase)
    return int(match.group(1)) if match else default


def write_phase_repository(root: Path, phase: str, device: str, instances: int,
                           models: list[str], staging: str) -> Path:
    """The repository of one phase: ``before`` = model_before.py.tmpl, one instance;
    ``after[-iN]`` = the package's model.py with the default (or N) instances; plus ``payload_sink``."""
    from coffea_sonic.server import write_repository
    from coffea_sonic.server.repository import config_text, model_config

    after = root / "after"
    if not after.exists():
        write_repository(after, models, backend="python", device=device,
                         instances=instances, staging=staging)
        write_sink(after, instances=2)
    if phase == "after":
        return after
    repository = root / phase
    shutil.copytree(after, repository, dirs_exist_ok=True)
    before_model = (HERE / "model_before.py.tmpl").read_text()
    for name in models:
        if phase == "before":
            (repository / name / "1" / "model.py").write_text(before_model)
        config = model_config(name, backend="python", device=device,
                              staging="pageable" if "pageable" in phase else staging,
                              instances=phase_instances(phase, instances),
                              gpu_input_tensors="gpuin" in phase and device == "gpu")
        (repository / name / "config.pbtxt").write_text(config_text(config))
    return repository


# -- main ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", default="cpu", choices=sorted(PLANS))
    parser.add_argument("--device", default=None, choices=["cpu", "gpu"])
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--instances", type=int, default=None,
                        help="model instances of the 'after' server (default: gpu 2, cpu 1)")
    parser.add_argument("--staging", default="pinned", choices=["pinned", "pageable"])
    parser.add_argument("--out", default=str(HERE))
    parser.add_argument("--tag", default=None, help="file name tag (default: the plan)")
    parser.add_argument("--only", default=None, help="comma list of kinds to run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from coffea_sonic.bench.machine import machine_info
    from coffea_sonic.bench.probes import (GpuUtilisation, run_gpu_mean, server_profile,
                                           server_statistics, statistics_transport)
    from coffea_sonic.server import LocalTritonServer
    from coffea_sonic.server.launcher import gpu_available

    device = args.device or ("gpu" if gpu_available() else "cpu")
    instances = args.instances or (2 if device == "gpu" else 1)
    plan = [entry for entry in PLANS[args.plan]
            if not args.only or entry[1] in args.only.split(",")]
    if device != "gpu":
        plan = [entry for entry in plan if entry[1] not in ("cuda", "local-resident")]
    models = sorted({entry[2] for entry in plan if entry[2] != SINK_NAME} | {"jet_tagger"})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or args.plan
    records: list[dict] = []
    report = {"machine": machine_info(), "device": device, "instances_after": instances,
              "staging": args.staging, "duration_s": args.duration, "plan": args.plan,
              "records": records}
    pool_size = max(entry[4] for entry in plan)
    pool = ClientPool(pool_size, _task)
    gpu = GpuUtilisation().__enter__()
    scratch = Path(tempfile.mkdtemp(prefix="bench-transport-"))
    try:
        phases = sorted({entry[0] for entry in plan},
                        key=lambda name: (PHASE_ORDER.index(name) if name in PHASE_ORDER else 99, name))
        for phase in phases:
            entries = [entry for entry in plan if entry[0] == phase]
            if not entries:
                continue
            repository = write_phase_repository(scratch, phase, device, instances, models,
                                                args.staging)
            began = time.time()
            try:
                server = LocalTritonServer(repository=repository, device=device).start()
            except Exception as error:  # noqa: BLE001 - report it and measure the other phases
                logger.error("phase %s: server did not start: %s", phase, error)
                records.append({"phase": phase, "errors": [f"server start: {error}"[:3000]]})
                continue
            with server:
                logger.info("%s server ready in %.1f s (%s)", phase, time.time() - began,
                            server.grpc_address)
                statistics = statistics_transport(server.grpc_address)
                for _, kind, model, rows, procs, in_flight in entries:
                    task = {"kind": kind, "model": model, "rows": rows, "in_flight": in_flight,
                            "duration": args.duration, "grpc": server.grpc_address,
                            "http": server.http_address, "device": device}
                    served = not kind.startswith("local") and kind != "verify"
                    window: dict = {}
                    before_stats = server_statistics(statistics, model) if served else None
                    try:
                        _, results = pool.run(task, procs,
                                           on_start=lambda start: window.setdefault("start", start))
                    except RuntimeError as error:  # a crashed or stuck worker: new pool, go on
                        logger.error("%s %s %s: %s", phase, kind, model, error)
                        records.append({"phase": phase, "kind": kind, "model": model, "rows": rows,
                                        "procs": procs, "errors": [str(error)]})
                        pool.close()
                        pool = ClientPool(pool_size, _task)
                        continue
                    after_stats = server_statistics(statistics, model) if served else None
                    errors = [r["error"] for r in results if "error" in r]
                    start = window["start"]
                    total_rows = sum(r.get("rows", 0) for r in results)
                    record = {
                        "phase": phase, "instances": phase_instances(phase, instances),
                        "kind": kind, "model": model, "rows": rows,
                        "procs": procs, "in_flight": in_flight,
                        "rows_per_s": round(total_rows / args.duration),
                        "gb_per_s": round(total_rows * row_bytes(model) / args.duration / 1e9, 3),
                        "requests": sum(r.get("requests", 0) for r in results),
                        "client_submit_ms": round(1e3 * sum(r.get("submit_s", 0) for r in results)
                                                  / max(sum(r.get("requests", 0) for r in results), 1), 3),
                        "latency_ms_p50": results[0].get("latency_ms_p50") if results else None,
                        "gpu_util": run_gpu_mean(gpu, start, start + args.duration),
                        "server": (server_profile(before_stats, after_stats, args.duration)
                                   if served else {}),
                        "transport_stats": results[0].get("stats") if results else {},
                        "errors": errors,
                    }
                    if results and "verify" in results[0]:
                        record["verify"] = results[0]["verify"]
                        logger.info("verify %s: %s", model, record["verify"])
                    records.append(record)
                    logger.info("%-6s %-14s %-16s rows=%-6d procs=%-2d k=%d  %12s rows/s  %6.3f GB/s"
                                "  gpu=%s%%  %s%s", phase, kind, model, rows, procs, in_flight,
                                f"{record['rows_per_s']:,}", record["gb_per_s"], record["gpu_util"],
                                record["server"], f" ERRORS {errors}" if errors else "")
                    (out / f"results-{tag}.json").write_text(json.dumps(report, indent=1))
    finally:
        gpu.__exit__(None, None, None)
        pool.close()
        shutil.rmtree(scratch, ignore_errors=True)
    (out / f"results-{tag}.json").write_text(json.dumps(report, indent=1))
    print(summary_markdown(report))
    return 0


def summary_markdown(report: dict) -> str:
    """One markdown table of every record (rows/s, GB/s, GPU, server profile)."""
    from coffea_sonic.bench.machine import machine_label

    host = report["machine"]
    where = f"{machine_label(host)} ({host.get('cpu_model')}, {host.get('cpu_cores')} cores)"
    lines = [f"machine: {where}, device {report['device']}, after-server instances "
             f"{report['instances_after']}, staging {report['staging']}, {report['duration_s']} s per run",
             "",
             "| phase | transport | model | batch | procs | in flight | rows/s | GB/s | GPU % | "
             "client submit ms | p50 ms | server queue / in / infer / out ms | avg batch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["records"]:
        if "rows_per_s" not in r:
            lines.append(f"| {r['phase']} | {r.get('kind', '')} | {r.get('model', '')} | ERROR "
                         f"{'; '.join(r.get('errors', []))[:300]} |")
            continue
        server = r.get("server") or {}
        profile = (f"{server.get('queue_ms')} / {server.get('compute_input_ms')} / "
                   f"{server.get('compute_infer_ms')} / {server.get('compute_output_ms')}"
                   if server else "–")
        lines.append(
            f"| {r['phase']} | {r['kind']} | {r['model']} | {r['rows']} | {r['procs']} | "
            f"{r['in_flight']} | {r['rows_per_s']:,} | {r['gb_per_s']} | {r['gpu_util'] or '–'} | "
            f"{r['client_submit_ms']} | {r['latency_ms_p50'] and round(r['latency_ms_p50'], 2)} | "
            f"{profile} | {server.get('avg_batch', '–')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
