"""The client side of ``coffea-sonic bench transport``: one way of sending requests per kind.

A client process (:class:`~coffea_sonic.bench.clients.ClientPool`, spawned, so nothing gRPC
crosses a fork) runs :func:`transport_task`: it builds the client of ``task["kind"]`` once,
warms it up, waits for the common start time and sends back-to-back requests of ``task["rows"]``
rows with ``task["in_flight"]`` outstanding for ``task["duration"]`` seconds; rows answered inside
that window count. Kinds (:data:`KINDS`):

================  ================================================================================
``tritonclient``  stock ``tritonclient.grpc.InferenceServerClient.infer``, one request at a time
                  (the baseline a user without this package has)
``grpc``          :class:`~coffea_sonic.transport.grpc.GrpcTransport` (TritonModel's remote wire)
``http``          :class:`~coffea_sonic.transport.http.HttpTransport` (binary tensors)
``shm``           :class:`~coffea_sonic.transport.shm.SystemShmTransport`
``cuda``          :class:`~coffea_sonic.transport.shm.CudaShmTransport`, inputs already on the GPU
``local``         the in-process engine (onnxruntime on CPU, torch on a GPU incl. host copies)
================  ================================================================================

The transports are the ones a worker opens (:func:`~coffea_sonic.transport.registry.open_transport`,
user defaults) and get one :class:`~coffea_sonic.transport.base.InferRequest` per request, as
TritonModel sends them.

>>> sorted(KINDS)
['cuda', 'grpc', 'http', 'local', 'shm', 'tritonclient']
>>> row_bytes(SINK_NAME), [spec.name for spec in output_specs(SINK_NAME)]
(9216, ['first'])
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future
from typing import Any

import numpy as np

from .clients import ready_then_start
from .modes import row_bytes as model_row_bytes
from .slice_model import SINK_NAME

__all__ = ["KINDS", "SINK_NAME", "example_inputs", "make_client", "output_specs", "row_bytes",
           "transport_task"]

#: what each kind is (the module docstring's table)
KINDS: dict[str, str] = {
    "tritonclient": "stock tritonclient.grpc infer()",
    "grpc": "GrpcTransport", "http": "HttpTransport", "shm": "SystemShmTransport",
    "cuda": "CudaShmTransport (inputs on the GPU)", "local": "in-process engine"}

#: the sink takes emtrk_cnn's rows (:func:`coffea_sonic.bench.slice_model.write_payload_sink`)
_SINK_INPUTS_OF = "emtrk_cnn"


def _inputs_model(model: str) -> str:
    return _SINK_INPUTS_OF if model == SINK_NAME else model


def row_bytes(model: str) -> int:
    """Input bytes of one row of ``model`` (the sink's are emtrk_cnn's)."""
    return model_row_bytes(_inputs_model(model))


def example_inputs(model: str, rows: int) -> dict[str, np.ndarray]:
    """``rows`` valid input rows of ``model`` (the zoo's examples)."""
    from .. import zoo

    return zoo.example_inputs(_inputs_model(model), rows, seed=1)


def output_specs(model: str) -> tuple:
    """The outputs ``model`` declares, as the transports take them (``TensorInfo``)."""
    from .. import zoo
    from ..core.tensors import TensorInfo

    if model == SINK_NAME:
        return (TensorInfo("first", "FP32", (1,)),)
    return zoo.declared_info(model).outputs


def _finished(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class StockClient:
    """``tritonclient.grpc``'s blocking ``infer``: answers in the calling thread."""

    def __init__(self, model: str, grpc_address: str) -> None:
        import tritonclient.grpc as grpcclient

        self.model, self.specs = model, output_specs(model)
        self.client = grpcclient.InferenceServerClient(grpc_address)

    def submit(self, inputs: dict) -> Future:
        import tritonclient.grpc as grpcclient

        tensors = []
        for name, array in inputs.items():
            tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        answer = self.client.infer(self.model, tensors)
        return _finished({spec.name: answer.as_numpy(spec.name) for spec in self.specs})


class TransportClient:
    """A worker's transport of ``kind`` to the server; one ``InferRequest`` per request."""

    def __init__(self, kind: str, model: str, grpc_address: str, http_address: str) -> None:
        from ..core.endpoint import ServerSettings
        from ..transport.registry import open_transport

        settings = (ServerSettings(http_address, protocol="http") if kind == "http"
                    else ServerSettings(grpc_address))
        self.transport = open_transport(settings, kind)
        self.model, self.specs = model, output_specs(model)

    def submit(self, inputs: dict) -> Future:
        from ..transport.base import InferRequest

        rows = int(next(iter(inputs.values())).shape[0])
        return self.transport.submit(InferRequest(self.model, "", inputs, self.specs, rows=rows,
                                                  timeout_s=120))


class LocalClient:
    """The in-process engine of ``model`` on ``device``: computes in the calling thread."""

    def __init__(self, model: str, device: str) -> None:
        from ..engines import CpuEngine, GpuEngine

        if model == SINK_NAME:
            raise ValueError(f"{SINK_NAME} is a server-side model: no in-process engine runs it")
        self.engine = GpuEngine(model) if device == "gpu" else CpuEngine(model)

    def submit(self, inputs: dict) -> Future:
        return _finished(self.engine(inputs))


def make_client(task: dict) -> Any:
    """The client of ``task["kind"]`` (a :data:`KINDS` key) for ``task["model"]``."""
    kind, model = task["kind"], task["model"]
    if kind == "tritonclient":
        return StockClient(model, task["grpc"])
    if kind == "local":
        return LocalClient(model, task["device"])
    if kind not in KINDS:
        raise ValueError(f"transport kind must be one of {', '.join(KINDS)}, not {kind!r}")
    return TransportClient(kind, model, task["grpc"], task["http"])


def _timed_window(client: Any, inputs: dict, task: dict, start_at: float) -> dict:
    """Requests back to back with ``in_flight`` outstanding until ``start_at + duration``."""
    rows, in_flight = task["rows"], task["in_flight"]
    end = start_at + task["duration"]
    pending: deque = deque()
    requests, submit_s, latencies = 0, 0.0, []
    while True:
        now = time.time()
        if now >= end and not pending:
            break
        if now < end and len(pending) < in_flight:
            began = time.perf_counter()
            pending.append((client.submit(inputs), now))
            submit_s += time.perf_counter() - began
            continue
        handle, sent = pending.popleft()
        handle.result()
        finished = time.time()
        if finished <= end:
            requests += 1
            latencies.append(finished - sent)
    return {"rows": requests * rows, "requests": requests, "submit_s": submit_s,
            "latency_ms_p50": 1e3 * float(np.median(latencies)) if latencies else None,
            "stats": dict(getattr(getattr(client, "transport", None), "stats", {}) or {})}


def transport_task(task: dict, tasks: Any, control: Any, cache: dict) -> dict:
    """A client process' window (see :class:`~coffea_sonic.bench.clients.ClientPool`)."""
    key = (task["kind"], task["model"], task["grpc"])
    if key not in cache:
        cache[key] = make_client(task)
    client = cache[key]
    inputs: Any = example_inputs(task["model"], task["rows"])
    if task["kind"] == "cuda":
        import torch

        inputs = {name: torch.from_numpy(array).cuda() for name, array in inputs.items()}
    for _ in range(2):  # connections, shared-memory regions, kernels
        client.submit(inputs).result()
    start_at = ready_then_start(tasks, control)
    return _timed_window(client, inputs, task, start_at)
