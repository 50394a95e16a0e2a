"""The transport interface: one shape for every wire (docs/internals/transport.md)."""

from __future__ import annotations

import abc
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

import numpy as np

from ..core.tensors import ModelInfo, TensorInfo
from ..stats import ServerStatistics

__all__ = ["InferAnswer", "InferRequest", "Transport", "TransportFuture", "deliver"]


@dataclass(eq=False)
class InferRequest:
    """One request: ``rows`` rows of validated ``inputs`` for ``model``/``version`` (``rows``:
    None without batching). ``outputs``: as the model declares them. What ``out``,
    ``priority`` and ``caller_waits`` do: docs/internals/transport.md ("The interface").
    """

    model: str
    version: str
    inputs: Mapping[str, np.ndarray]
    outputs: tuple[TensorInfo, ...]
    rows: int | None = None
    timeout_s: float = 60.0
    request_id: str = ""
    out: Mapping[str, np.ndarray] | None = None
    priority: int = 0
    caller_waits: bool = False
    #: headers of this request alone (e.g. a W3C ``traceparent``); names lower-case
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def nbytes(self) -> int:
        """Tensor bytes this request carries."""
        return sum(array.nbytes for array in self.inputs.values())


@dataclass(eq=False)
class InferAnswer:
    """A server's answer: ``{name: array}``, the version that answered, bytes received;
    ``delivered``: outputs already written into the request's ``out`` destinations."""

    outputs: dict[str, np.ndarray]
    model_version: str = ""
    nbytes: int = 0
    delivered: frozenset[str] = field(default_factory=frozenset)


def deliver(request: InferRequest, name: str, array: np.ndarray) -> np.ndarray:
    """Write ``array`` (an answered output) into ``request.out[name]`` when it fits exactly;
    returns the destination when written, else ``array`` itself."""
    target = request.out.get(name) if request.out else None
    if (target is None or request.rows is None or array.ndim == 0
            or array.shape[0] != request.rows or array.shape[1:] != target.shape[1:]
            or target.shape[0] > array.shape[0]
            or not np.can_cast(array.dtype, target.dtype, casting="safe")):
        return array
    np.copyto(target, array[: target.shape[0]], casting="safe")
    return target


def answer_from(request: InferRequest, arrays: Mapping[str, np.ndarray], *, version: str = "",
                nbytes: int | None = None, copy: bool = False) -> InferAnswer:
    """An :class:`InferAnswer` of ``arrays``, delivered into ``request.out`` where they fit;
    with ``copy`` (the arrays view reused memory) what is not delivered is copied out."""
    outputs: dict[str, np.ndarray] = {}
    delivered = []
    for name, array in arrays.items():
        placed = deliver(request, name, array)
        if placed is not array:
            delivered.append(name)
        elif copy:
            placed = np.array(array, copy=True)
        outputs[name] = placed
    received = nbytes if nbytes is not None else sum(a.nbytes for a in arrays.values())
    return InferAnswer(outputs, version, received, frozenset(delivered))


class TransportFuture(Future):
    """The pending :class:`InferAnswer` of one request; ``cancel()`` runs the cancel hook.

    >>> future = TransportFuture()
    >>> future.resolve(InferAnswer({}))
    True
    >>> future.result().outputs, future.resolve(InferAnswer({}))
    ({}, False)
    """

    def __init__(self, on_cancel: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.on_cancel = on_cancel

    def cancel(self) -> bool:
        if not super().cancel():
            return False
        hook, self.on_cancel = self.on_cancel, None
        if hook is not None:
            hook()
        return True

    def resolve(self, answer: InferAnswer) -> bool:
        """Complete with ``answer``; False if already done (cancelled, or answered)."""
        try:
            self.set_result(answer)
        except InvalidStateError:
            return False
        return True

    def fail(self, error: BaseException) -> bool:
        """Complete with ``error``; False if already done."""
        try:
            self.set_exception(error)
        except InvalidStateError:
            return False
        return True


class Transport(abc.ABC):
    """One wire to one Triton server (``address``), shared by every model of a process.

    Every method raises :class:`~coffea_sonic.transport.errors.TransportError` on failure;
    ``submit`` reports failures through its future instead.
    """

    #: "grpc", "shm", "cuda", "http" or "memory"
    name: ClassVar[str] = ""
    address: str = ""

    @abc.abstractmethod
    def submit(self, request: InferRequest) -> TransportFuture:
        """Send ``request`` now; the future gives its :class:`InferAnswer` or TransportError."""

    def infer(self, request: InferRequest) -> InferAnswer:
        """Send ``request`` and wait for the answer."""
        return self.submit(request).result()

    @abc.abstractmethod
    def ready(self, timeout_s: float) -> bool:
        """Whether the server answers and says it is ready."""

    @abc.abstractmethod
    def model_index(self, timeout_s: float) -> dict[str, tuple[str, ...]]:
        """``{model: (ready versions...)}`` from the repository index."""

    @abc.abstractmethod
    def model_info(self, model: str, version: str, timeout_s: float) -> ModelInfo:
        """What ``model`` (``version``; ``""`` for the latest) declares: tensors, batching."""

    @abc.abstractmethod
    def statistics(self, model: str, version: str, timeout_s: float) -> ServerStatistics:
        """Triton's cumulative statistics of ``model`` on this server."""

    def describe(self) -> dict[str, Any]:
        """What this transport found out about its server (for ``coffea-sonic check``)."""
        return {"transport": self.name, "address": self.address}

    def close(self) -> None:
        """Release what this transport holds (regions, connections); idempotent."""

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r})"
