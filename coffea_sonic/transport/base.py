"""The transport interface: one shape for every wire to a Triton server (httpx's split).

The client (:class:`~coffea_sonic.model.TritonModel`) owns policy: validation, splitting, the
in-flight window, retries, failover, reassembly and statistics. A transport owns the wire: it
sends one :class:`InferRequest` and hands back an :class:`InferAnswer` of output arrays, or a
:class:`~coffea_sonic.transport.errors.TransportError` that says what the failure means
(``busy``, ``down``, ``not_found``, ...), so the client never looks at gRPC codes or HTTP statuses.

Implementations: :class:`~coffea_sonic.transport.grpc.GrpcTransport` (the default for a remote
server), :class:`~coffea_sonic.transport.shm.SystemShmTransport` and
:class:`~coffea_sonic.transport.shm.CudaShmTransport` (a server on this host),
:class:`~coffea_sonic.transport.http.HttpTransport` (``triton+http://``) and
:class:`~coffea_sonic.transport.memory.MemoryTransport` (in-process, for fast unit tests).

>>> import numpy as np
>>> from coffea_sonic.core.tensors import TensorInfo
>>> out = np.zeros((2, 1), np.float32)
>>> request = InferRequest("m", "1", {"x": np.ones((3, 1), np.float32)},
...                        (TensorInfo("y", "FP32", (1,)),), rows=3, out={"y": out})
>>> deliver(request, "y", np.arange(3, dtype=np.float32).reshape(3, 1)) is out, out.ravel()
(True, array([0., 1.], dtype=float32))
"""

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
    """One request: ``rows`` rows of validated ``inputs`` for ``model``/``version``.

    ``outputs``: the outputs to return, as the model declares them. ``rows``: the batch size sent
    (None for models without batching). ``out``: optional destinations ``{name: array}``; a
    transport that receives an output of exactly ``rows`` rows with the destination's per-row
    shape and a dtype that casts safely writes its first ``len(out[name])`` rows there (the one
    copy of the output bytes) and lists the name in :attr:`InferAnswer.delivered`.
    ``priority``: the request's priority level for the dynamic batcher (1 is served first; 0: the
    model's default level), sent as the request parameter ``priority``. ``caller_waits``: the
    thread that submits the request would only wait for its answer, so a transport may send it
    and read the answer in that thread and return a done future (the gRPC transport does: no
    hand-off to gRPC's threads and back, which costs wake-ups, each a wait for a core on a busy
    machine).
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
    #: headers of this request alone, sent after the server settings' (gRPC metadata, HTTP
    #: headers): e.g. a W3C ``traceparent``; names lower-case
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def nbytes(self) -> int:
        """Tensor bytes this request carries."""
        return sum(array.nbytes for array in self.inputs.values())


@dataclass(eq=False)
class InferAnswer:
    """A server's answer: ``{name: array}``, the version that answered, bytes received.

    ``delivered``: outputs already written into the request's ``out`` destinations (their
    entries in ``outputs`` are those destination arrays, ``rows`` checked by the transport).
    """

    outputs: dict[str, np.ndarray]
    model_version: str = ""
    nbytes: int = 0
    delivered: frozenset[str] = field(default_factory=frozenset)


def deliver(request: InferRequest, name: str, array: np.ndarray) -> np.ndarray:
    """Write ``array`` (an answered output) into ``request.out[name]`` when it fits exactly.

    Returns the destination when written, else ``array`` itself (the caller copies it if it is
    a view of memory it will reuse, and the client's check reports what is wrong with it).
    """
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
    """An :class:`InferAnswer` of ``arrays``, delivered into ``request.out`` where they fit.

    ``copy``: the arrays view memory the transport reuses (a shared-memory slot), so whatever is
    not delivered is copied out.
    """
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
    """The pending :class:`InferAnswer` of one request (a ``concurrent.futures.Future``).

    ``cancel()`` works until the answer arrives and runs the transport's cancel hook (which
    stops the RPC and retires any shared-memory slot the server may still write into).

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
    ``submit`` reports failures through its future instead. Control calls (readiness, index,
    metadata, statistics) take a timeout; a server that restricts a protocol group answers
    ``TransportError(kind="restricted")``.
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
