"""One runner per benchmark mode: run a whole chunk in ``batch_size`` pieces, time every request.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .. import zoo
from ..errors import ConfigurationError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerSpec:
    """What one runner does: mode, model, request size, pipelining, and where the server is."""

    mode: str
    model: str
    #: rows per request; 0 = the tool's own default (whole chunk in one call for the engines and
    #: TritonModel, which splits by max_batch_size; the server's preferred size for the wrapper)
    batch_size: int
    in_flight: int = 1
    #: ``host:port`` of the Triton gRPC endpoint (served modes only)
    server_address: str | None = None
    #: model version on that server ("" = latest; coffea's wrapper needs an explicit one)
    model_version: str = "1"
    timeout_s: float = 120.0
    cpu_threads: int = 0


def _tensor_bytes(tensors) -> int:
    return sum(int(np.prod(tensor.dims, dtype=np.int64)) * np.dtype(tensor.dtype).itemsize
               for tensor in tensors)


def row_bytes(model: str) -> int:
    """Input tensor bytes of one row of ``model`` (all inputs together).

    >>> row_bytes("emtrk_cnn")
    9216
    """
    return _tensor_bytes(zoo.spec(model).inputs)


def output_row_bytes(model: str) -> int:
    """Output tensor bytes of one row of ``model``.

    >>> output_row_bytes("jet_tagger")
    12
    """
    return _tensor_bytes(zoo.spec(model).outputs)


def _slices(rows: int, batch_size: int) -> list[slice]:
    if batch_size <= 0:
        return [slice(0, rows)]
    return [slice(start, min(start + batch_size, rows)) for start in range(0, rows, batch_size)]


def _concatenate(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


class ChunkRunner:
    """Base: split a chunk into requests of ``batch_size`` rows and record each one's latency."""

    def __init__(self, spec: RunnerSpec) -> None:
        self.spec = spec
        self.latencies_s: list[float] = []

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _one_at_a_time(self, call, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``call`` on each ``batch_size`` piece in turn, each call timed."""
        parts = []
        for piece in _slices(len(next(iter(inputs.values()))), self.spec.batch_size):
            started = time.perf_counter()
            parts.append(call({name: value[piece] for name, value in inputs.items()}))
            self.latencies_s.append(time.perf_counter() - started)
        return _concatenate(parts)

    def payload_bytes(self, rows: int) -> int:
        """Input tensor bytes this mode moves for a chunk of ``rows`` rows."""
        return rows * row_bytes(self.spec.model)

    def client_counters(self) -> dict[str, float]:
        """Cumulative client-side counters (bytes on the wire, ...), if the mode has them."""
        return {}

    def close(self) -> None:
        """Release connections and devices."""


class EngineRunner(ChunkRunner):
    """``cpu`` / ``local-gpu``: call an in-process engine once per batch."""

    def __init__(self, spec: RunnerSpec) -> None:
        super().__init__(spec)
        from ..engines import CpuEngine, GpuEngine

        if spec.mode == "cpu":
            self.engine = CpuEngine(spec.model, threads=spec.cpu_threads)
        else:
            self.engine = GpuEngine(spec.model)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._one_at_a_time(self.engine, inputs)


class TritonModelRunner(ChunkRunner):
    """``remote`` / ``remote-sync``: our client, ``in_flight`` requests of one batch each."""

    def __init__(self, spec: RunnerSpec) -> None:
        super().__init__(spec)
        from ..model import TritonModel

        if not spec.server_address:
            raise ConfigurationError(f"mode {spec.mode!r} needs a server address")
        self.in_flight = 1 if spec.mode == "remote-sync" else max(1, spec.in_flight)
        version = f"/{spec.model_version}" if spec.model_version else ""
        self.model = TritonModel(f"triton+grpc://{spec.server_address}/{spec.model}{version}",
                                 timeout_s=spec.timeout_s, max_in_flight=self.in_flight)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.in_flight == 1:
            return self._one_at_a_time(self.model, inputs)
        pieces = _slices(len(next(iter(inputs.values()))), self.spec.batch_size)
        parts: list[dict[str, np.ndarray]] = []
        # Our own window of one-batch calls: exactly in_flight outstanding, in-order results,
        # and a latency per request (TritonModel itself only sums them).
        window: deque = deque()
        for piece in pieces:
            if len(window) >= self.in_flight:
                started, handle = window.popleft()
                parts.append(handle.result())
                self.latencies_s.append(time.perf_counter() - started)
            window.append((time.perf_counter(), self.model.infer_async(
                {name: value[piece] for name, value in inputs.items()})))
        while window:
            started, handle = window.popleft()
            parts.append(handle.result())
            self.latencies_s.append(time.perf_counter() - started)
        return _concatenate(parts)

    def client_counters(self) -> dict[str, float]:
        return self.model.stats.to_dict()

    def close(self) -> None:
        close = getattr(self.model, "close", None)
        if callable(close):
            close()


def coffea_wrapper_class() -> type:
    """coffea's ``triton_wrapper`` as shipped, subclassed as a user must (``prepare_awkward``),
    each request timed into ``latencies_s``; only ``numpy_call`` is benchmarked."""
    from coffea.ml_tools.triton_wrapper import triton_wrapper

    class TimedTritonWrapper(triton_wrapper):
        """coffea's wrapper as shipped, with each request timed (``run_infer`` is its one call)."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.latencies_s: list[float] = []

        def prepare_awkward(self, *args, **kwargs):
            # Only the numpy path (``numpy_call``) is benchmarked; awkward preparation is the
            # user's code and the same for every mode.
            raise NotImplementedError("the benchmark calls numpy_call directly")

        def run_infer(self, inputs, outputs, attempt=0):
            started = time.perf_counter()
            try:
                return super().run_infer(inputs, outputs, attempt)
            finally:
                if attempt == 0:
                    self.latencies_s.append(time.perf_counter() - started)

    return TimedTritonWrapper


class CoffeaWrapperRunner(ChunkRunner):
    """``coffea-wrapper``: ``coffea.ml_tools.triton_wrapper.numpy_call``, as its tests call it."""

    def __init__(self, spec: RunnerSpec) -> None:
        super().__init__(spec)
        if not spec.server_address:
            raise ConfigurationError("mode 'coffea-wrapper' needs a server address")
        if not spec.model_version:
            raise ConfigurationError("coffea's triton_wrapper needs an explicit model version")
        wrapper_class = coffea_wrapper_class()
        # The wrapper defaults to TLS for gRPC; the benchmark server speaks plain gRPC.
        self.wrapper = wrapper_class(
            f"triton+grpc://{spec.server_address}/{spec.model}/{spec.model_version}",
            client_args={"ssl": False}, batch_size=spec.batch_size if spec.batch_size > 0 else -1)
        self.latencies_s = self.wrapper.latencies_s
        self.output_names = list(zoo.spec(spec.model).output_names)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.wrapper.numpy_call(self.output_names, dict(inputs))

    def payload_bytes(self, rows: int) -> int:
        # The wrapper pads every request to batch_size rows (resolved from the server's config
        # on first use when left at its default).
        batch_size = self.wrapper.batch_size
        requests = -(-rows // batch_size)
        return requests * batch_size * row_bytes(self.spec.model)

    def close(self) -> None:
        client = getattr(self.wrapper, "_client", None)
        if client is not None:
            client.close()


RUNNERS: dict[str, type[ChunkRunner]] = {
    "cpu": EngineRunner,
    "local-gpu": EngineRunner,
    "remote": TritonModelRunner,
    "remote-sync": TritonModelRunner,
    "coffea-wrapper": CoffeaWrapperRunner,
}


def make_runner(spec: RunnerSpec) -> ChunkRunner:
    """The runner of ``spec.mode`` (raises ``ConfigurationError`` for an unknown mode)."""
    try:
        runner_class = RUNNERS[spec.mode]
    except KeyError:
        raise ConfigurationError(
            f"unknown bench mode {spec.mode!r}; choose from {sorted(RUNNERS)}") from None
    return runner_class(spec)
