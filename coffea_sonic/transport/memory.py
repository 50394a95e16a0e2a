"""An in-process transport for fast unit tests (docs/internals/transport.md)."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping

import numpy as np

from ..core.tensors import ModelInfo
from ..stats import ServerStatistics
from .base import InferRequest, Transport, TransportFuture, answer_from
from .errors import TransportError

__all__ = ["MemoryTransport"]

Engine = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


class MemoryTransport(Transport):
    """Serves ``models`` (``{name: (ModelInfo, engine)}``) in this process at ``address``."""

    name = "memory"

    def __init__(self, models: Mapping[str, tuple[ModelInfo, Engine]], *,
                 address: str = "memory:0", restricted: frozenset[str] = frozenset()) -> None:
        self.address = address
        self.models = dict(models)
        #: protocol groups answered with kind "restricted" ("model-repository", "statistics")
        self.restricted = frozenset(restricted)
        self.up = True
        self.requests = 0
        self._faults: deque[tuple[str, Any]] = deque()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._statistics: dict[str, ServerStatistics] = {}

    @classmethod
    def factory(cls, transports: Mapping[str, "MemoryTransport"]) -> Callable[[Any], Transport]:
        """A ``TritonModel(transport=...)`` factory answering each address with its transport."""

        def make(settings: Any) -> Transport:
            try:
                return transports[settings.address]
            except KeyError:
                raise TransportError("down", "nothing listens there",
                                     address=settings.address) from None

        return make

    # -- fault injection ----------------------------------------------------------------------------
    def fail_next(self, kind: str, count: int = 1, detail: str = "injected") -> None:
        """The next ``count`` requests fail with ``TransportError(kind)``."""
        with self._lock:
            self._faults.extend([("error", (kind, detail))] * count)

    def rewrite_next(self, rewrite: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
                     count: int = 1, version: str | None = None) -> None:
        """The next ``count`` answers are passed through ``rewrite`` (and answer ``version``)."""
        with self._lock:
            self._faults.extend([("rewrite", (rewrite, version))] * count)

    # -- the interface ------------------------------------------------------------------------------
    def submit(self, request: InferRequest) -> TransportFuture:
        future = TransportFuture()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(4, thread_name_prefix="csonic-memory")
            pool = self._pool
            fault = self._faults.popleft() if self._faults else None
            self.requests += 1
        pool.submit(self._answer, request, future, fault)
        return future

    def _answer(self, request: InferRequest, future: TransportFuture, fault: Any) -> None:
        try:
            self._check_open()
            if fault is not None and fault[0] == "error":
                kind, detail = fault[1]
                raise TransportError(kind, detail, address=self.address)
            info, engine = self._model(request.model)
            outputs = {name: np.asarray(array) for name, array in engine(request.inputs).items()}
            version = request.version or info.latest_version
            if fault is not None and fault[0] == "rewrite":
                rewrite, answered = fault[1]
                outputs = rewrite(outputs)
                version = answered if answered is not None else version
            rows = request.rows or 0
            with self._lock:
                stats = self._statistics.setdefault(request.model, ServerStatistics())
                self._statistics[request.model] = stats + ServerStatistics(
                    success_count=1, inference_count=rows, execution_count=1)
            future.resolve(answer_from(request, outputs, version=version))
        except BaseException as error:  # noqa: BLE001 - reported through the future
            future.fail(error)

    def _model(self, model: str) -> tuple[ModelInfo, Engine]:
        self._check_open()
        try:
            return self.models[model]
        except KeyError:
            raise TransportError("not_found", f"Request for unknown model: '{model}'",
                                 address=self.address, code="NOT_FOUND") from None

    def ready(self, timeout_s: float) -> bool:
        self._check_open()
        return True

    def model_index(self, timeout_s: float) -> dict[str, tuple[str, ...]]:
        self._check_open("model-repository")
        return {name: info.versions for name, (info, _) in sorted(self.models.items())}

    def model_info(self, model: str, version: str, timeout_s: float) -> ModelInfo:
        info, _ = self._model(model)
        if version and version not in info.versions:
            raise TransportError("not_found", f"{model} has no version {version}",
                                 address=self.address, code="NOT_FOUND")
        return info

    def statistics(self, model: str, version: str, timeout_s: float) -> ServerStatistics:
        self._check_open("statistics")
        self._model(model)
        return self._statistics.get(model, ServerStatistics())

    def _check_open(self, group: str = "") -> None:
        if not self.up:
            raise TransportError("down", "server stopped", address=self.address)
        if group in self.restricted:
            raise TransportError("restricted", f"This protocol is restricted, expecting header "
                                 f"'triton-grpc-protocol-key' ({group})", address=self.address)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
