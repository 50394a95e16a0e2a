"""What the system and CUDA shm transports share (docs/internals/transport-shm.md)."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.endpoint import ServerSettings
from ...core.tensors import ModelInfo, numpy_dtype
from ...errors import InferenceError
from ...stats import ServerStatistics
from ..base import InferAnswer, InferRequest, Transport, TransportFuture
from ..errors import TransportError, from_grpc
from ..grpc.transport import GrpcTransport
from ..senders import send_soon
from .pool import Slot, SlotPool
from .regions import align

__all__ = ["Layout", "SlotTransport", "plan", "shm_parameters"]


@dataclass
class Layout:
    """Where each tensor of one request sits in a slot: ``{name: (offset, nbytes)}``."""

    inputs: dict[str, tuple[int, int]] = field(default_factory=dict)
    outputs: dict[str, tuple[int, int]] = field(default_factory=dict)
    total: int = 0


def plan(request: InferRequest, *, every_output: bool = False) -> Layout | None:
    """The slot layout of ``request``, or None when it must travel inline (BYTES or empty inputs;
    with ``every_output``, an output of unknown size: docs/internals/transport-shm.md)."""
    layout = Layout()
    offset = 0
    for name, value in request.inputs.items():
        if isinstance(value, np.ndarray) and (value.dtype == object or value.dtype.kind in "SU"
                                              or value.dtype.type is np.void or value.size == 0):
            return None
        nbytes = value.nbytes if isinstance(value, np.ndarray) else (  # a torch tensor
            value.numel() * value.element_size())
        layout.inputs[name] = (offset, nbytes)
        offset = align(offset + layout.inputs[name][1])
    for output in request.outputs:
        dims = ((request.rows,) if request.rows is not None else ()) + tuple(output.dims)
        if output.datatype in ("BYTES", "STRING") or any(d < 0 for d in dims):
            if every_output:
                return None
            continue
        layout.outputs[output.name] = (offset, math.prod(dims) * output.dtype.itemsize)
        offset = align(offset + layout.outputs[output.name][1])
    layout.total = max(offset, 1)
    return layout


def shm_parameters(tensor: Any, region: str, offset: int, nbytes: int) -> None:
    """Point a request's input or output tensor at ``region`` (Triton's tensor parameters)."""
    tensor.parameters["shared_memory_region"].string_param = region
    tensor.parameters["shared_memory_byte_size"].int64_param = nbytes
    if offset:
        tensor.parameters["shared_memory_offset"].int64_param = offset


def slot_message(request: InferRequest, slot: Slot, layout: Layout) -> Any:
    """The gRPC request of ``request`` with its outputs pointed at ``slot`` (an output of unknown
    size, e.g. classification's BYTES, is answered in the message); the caller adds the inputs."""
    from tritonclient.grpc import service_pb2

    message = service_pb2.ModelInferRequest(model_name=request.model,
                                            model_version=request.version, id=request.request_id)
    for output in request.outputs:
        tensor = message.outputs.add(name=output.name)
        if output.name in layout.outputs:
            shm_parameters(tensor, slot.name, *layout.outputs[output.name])
        elif output.classification:
            tensor.parameters["classification"].int64_param = output.classification
    return message


def checked_output(tensor: Any, layout: Layout, model: str) -> tuple[np.dtype, tuple, int]:
    """dtype, shape and offset of an output the server wrote into the slot (checked to fit)."""
    dtype, shape = numpy_dtype(tensor.datatype), tuple(tensor.shape)
    offset, reserved = layout.outputs[tensor.name]
    nbytes = math.prod(shape) * dtype.itemsize
    if dtype == object or nbytes > reserved:
        raise InferenceError(
            f"model {model!r} output {tensor.name!r}: server answered shape {list(shape)} "
            f"{tensor.datatype} ({nbytes} bytes) but {reserved} bytes were reserved from the "
            "declared dims; the served model does not match them")
    return dtype, shape, offset


def failed(error: BaseException, address: str) -> TransportFuture:
    """A future failed with ``error`` as a TransportError (gRPC errors classified)."""
    if not (isinstance(error, TransportError) or callable(getattr(error, "code", None))):
        error = TransportError("internal", f"{type(error).__name__}: {error}", address=address)
    future = TransportFuture()
    future.fail(from_grpc(error, address))
    return future


class SlotTransport(Transport):
    """A transport whose requests travel through slots of a :class:`SlotPool` of ``kind``.

    Subclasses implement :meth:`_message` (write the inputs, name the region) and :meth:`_read`
    (the :class:`InferAnswer` from the slot); control calls and registrations go through
    ``self.grpc``, a :class:`GrpcTransport` of the same settings.
    """

    #: whether every output must fit in the slot (else the request travels inline)
    every_output = False

    def __init__(self, settings: ServerSettings | str, kind: Any, max_slots: int) -> None:
        self.settings = ServerSettings(settings) if isinstance(settings, str) else settings
        self.address = self.settings.address
        self.max_slots = max_slots
        self.grpc = GrpcTransport(self.settings)
        self.pool = SlotPool(self.grpc, kind, max_slots)
        self._stats_lock = threading.Lock()
        self.stats = {"requests": 0, "shm_requests": 0, "inline_requests": 0, "shm_bytes": 0,
                      "shm_region_errors": 0}

    def regions(self) -> list[str]:
        """Names of the regions this transport holds now."""
        return self.pool.regions()

    def _count(self, key: str, amount: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] += amount

    # -- inference ----------------------------------------------------------------------------------
    def submit(self, request: InferRequest) -> TransportFuture:
        return self._submit(request, None)

    def _submit(self, request: InferRequest, context: Any) -> TransportFuture:
        self._count("requests")
        layout = plan(request, every_output=self.every_output)
        slot = None
        if layout is not None:
            try:
                slot = self.pool.acquire(layout.total, request.timeout_s)
            except Exception as error:  # noqa: BLE001 - reported through the future
                return failed(error, self.address)
        if slot is None:  # BYTES inputs, every slot busy, or no room for regions here
            self._count("inline_requests")
            return self._inline(request, context)
        try:
            message = self._message(request, slot, layout)
            if request.priority:
                message.parameters["priority"].uint64_param = request.priority
            self.grpc.connection
        except Exception as error:  # noqa: BLE001 - the server never saw it: the slot is clean
            self.pool.release(slot)
            return failed(error, self.address)
        self._count("shm_requests")
        self._count("shm_bytes", sum(nbytes for _, nbytes in layout.inputs.values()))
        future = TransportFuture()
        # a blocking call: half the client CPU of gRPC's future calls (see GrpcTransport.submit)
        if request.caller_waits:
            self._call(message, future, request, slot, layout, context)
        else:
            send_soon(self._call, message, future, request, slot, layout, context)
        return future

    def _inline(self, request: InferRequest, context: Any) -> TransportFuture:
        return self.grpc.submit(request)

    def _message(self, request: InferRequest, slot: Slot, layout: Layout) -> Any:
        raise NotImplementedError

    def _read(self, response: Any, request: InferRequest, slot: Slot, layout: Layout,
              context: Any) -> InferAnswer:
        raise NotImplementedError

    def _call(self, message: Any, future: TransportFuture, request: InferRequest, slot: Slot,
              layout: Layout, context: Any) -> None:
        """Make the request's call and resolve ``future``. A request cancelled while queued is
        never sent; one cancelled in flight is answered first, so its slot is clean either way."""
        if future.done():
            self.pool.release(slot)
            return
        try:
            response = self.grpc.connection.stub.ModelInfer(
                message, timeout=request.timeout_s,
                metadata=self.grpc.metadata + request.headers)
        except Exception as error:  # noqa: BLE001 - a timed-out request may still be written
            self.pool.drop(slot)
            failure = from_grpc(error, self.address)
            if failure.kind == "shm_region":
                self._count("shm_region_errors")
                # the server forgot one region: it may have forgotten them all; other requests
                # in flight on slots of that generation then meet the same forgetting again
                failure.repeated = not self.pool.retire(slot.generation)
            future.fail(failure)
            return
        if future.done():  # cancelled while in flight, now answered: the slot is clean
            self.pool.release(slot)
            return
        try:
            answer = self._read(response, request, slot, layout, context)
        except Exception as failure:  # noqa: BLE001 - never lose an error in a sender thread
            self.pool.release(slot)
            future.fail(failure if isinstance(failure, InferenceError) else InferenceError(
                f"model {request.model!r} at {self.address}: cannot read the answer "
                f"({type(failure).__name__}: {failure})"))
            return
        self.pool.release(slot)  # before resolving: a waiter's next request finds it free
        future.resolve(answer)

    # -- control calls (plain gRPC) ---------------------------------------------------------------
    def ready(self, timeout_s: float) -> bool:
        return self.grpc.ready(timeout_s)

    def model_index(self, timeout_s: float) -> dict[str, tuple[str, ...]]:
        return self.grpc.model_index(timeout_s)

    def model_info(self, model: str, version: str, timeout_s: float) -> ModelInfo:
        return self.grpc.model_info(model, version, timeout_s)

    def statistics(self, model: str, version: str, timeout_s: float) -> ServerStatistics:
        return self.grpc.statistics(model, version, timeout_s)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "max_slots": self.max_slots, "regions": self.regions(),
                "disabled": self.pool.disabled, **self.stats, **self.pool.stats}

    def close(self) -> None:
        """Unregister and free every region (requests in flight free theirs when done)."""
        self.pool.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r}, slots={len(self.regions())}/{self.max_slots})"
