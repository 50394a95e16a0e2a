"""CUDA shared memory to a server on this host (how: docs/internals/transport-shm.md)."""

from __future__ import annotations

import dataclasses

import logging
import math
from typing import Any, Mapping, Sequence

import numpy as np

from ...core.endpoint import ServerSettings
from ...core.process_local import ProcessLocal
from ...core.tensors import TensorInfo, triton_dtype
from ...errors import InferenceError, MissingDependencyError
from ..base import InferAnswer, InferRequest, TransportFuture
from .common import Layout, SlotTransport, checked_output, shm_parameters, slot_message
from .pool import DEFAULT_MAX_SLOTS, RegionKind, Slot
from .regions import new_region_name

logger = logging.getLogger(__name__)

__all__ = ["CudaRegion", "CudaRegions", "CudaShmTransport", "copy_host_to_device",
           "probe_cuda_shared_memory"]

#: host arrays at least this large are copied to the GPU through pinned memory in parts
STAGED_COPY_BYTES = 2 * 2**20
#: threads (and parts) of one staged copy (8 were no faster than 4 on an H200 machine)
STAGED_COPY_THREADS = 4
#: the staged copies' threads (a forked child has none of its parent's threads)
_copy_pools: ProcessLocal[int, Any] = ProcessLocal("CUDA staging copy threads")


class CudaDriver:
    """The few CUDA driver calls CUDA IPC regions need (libcuda through ctypes)."""

    _instance: "CudaDriver | None" = None

    def __init__(self) -> None:
        import ctypes

        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise MissingDependencyError(
                f"CUDA shared memory needs the CUDA driver (libcuda.so.1): {error}") from None
        self.ctypes = ctypes

    @classmethod
    def get(cls) -> "CudaDriver":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def check(self, code: int, what: str) -> None:
        if code != 0:
            name = self.ctypes.c_char_p()
            self.lib.cuGetErrorName(code, self.ctypes.byref(name))
            raise InferenceError(f"CUDA driver call {what} failed: "
                                 f"{(name.value or b'?').decode()} ({code})")

    def make_current(self, device: int) -> None:
        """Make ``device``'s primary context (torch's) current in this thread."""
        ctypes = self.ctypes
        current = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if current.value:
            return
        context = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
                   "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")

    def alloc(self, size: int) -> int:
        pointer = self.ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(self.ctypes.byref(pointer), self.ctypes.c_size_t(size)),
                   f"cuMemAlloc({size})")
        return pointer.value

    def ipc_handle(self, pointer: int) -> bytes:
        handle = (self.ctypes.c_char * 64)()
        self.check(self.lib.cuIpcGetMemHandle(handle, self.ctypes.c_uint64(pointer)),
                   "cuIpcGetMemHandle")
        return bytes(handle)

    def free(self, pointer: int) -> None:
        self.check(self.lib.cuMemFree_v2(self.ctypes.c_uint64(pointer)), "cuMemFree")


class _CudaArray:
    """``__cuda_array_interface__`` over raw device memory (torch wraps it without a copy)."""

    def __init__(self, pointer: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (pointer, False), "version": 3,
            "strides": None,
        }


_TORCH_NAMES = {"float32": "float32", "float64": "float64", "float16": "float16",
                "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8",
                "uint8": "uint8", "bool": "bool"}


def torch_dtype(dtype: Any) -> Any:
    """The torch dtype of a numpy dtype (torch dtypes pass through)."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    return getattr(torch, _TORCH_NAMES[np.dtype(dtype).name])


def numpy_dtype_of(tensor: Any) -> np.dtype:
    """The numpy dtype of a torch tensor (or numpy array)."""
    if isinstance(tensor, np.ndarray):
        return tensor.dtype
    return np.dtype(str(tensor.dtype).removeprefix("torch."))


class CudaRegion:
    """One device allocation of ``size`` bytes on ``device`` and its IPC handle."""

    def __init__(self, size: int, device: int) -> None:
        import torch

        self.name = new_region_name()
        self.size = size
        self.device = device
        driver = CudaDriver.get()
        torch.cuda.init()
        with torch.cuda.device(device):
            driver.make_current(device)
            self.pointer = driver.alloc(size)
            self.handle = driver.ipc_handle(self.pointer)
        self.bytes = torch.as_tensor(_CudaArray(self.pointer, size), device=f"cuda:{device}")

    def view(self, offset: int, dtype: Any, shape: Any) -> Any:
        """A torch CUDA view of ``shape``/``dtype`` at byte ``offset`` (no copy)."""
        dtype = torch_dtype(dtype)
        itemsize = dtype.itemsize
        count = math.prod(shape)
        return self.bytes[offset: offset + count * itemsize].view(dtype).view(tuple(shape))

    def close(self) -> None:
        if self.pointer:
            self.bytes = None
            driver = CudaDriver.get()
            driver.make_current(self.device)
            driver.free(self.pointer)
            self.pointer = 0


class CudaRegions(RegionKind):
    """Device allocations on ``device``, registered with their CUDA IPC handle."""

    rpc = "Cuda"
    label = "CUDA shared memory"

    def __init__(self, device: int = 0) -> None:
        self.device = device

    def make(self, size: int) -> CudaRegion:
        return CudaRegion(size, self.device)

    def register_request(self, region: CudaRegion) -> Any:
        from tritonclient.grpc import service_pb2

        return service_pb2.CudaSharedMemoryRegisterRequest(
            name=region.name, raw_handle=region.handle, device_id=region.device,
            byte_size=region.size)


class CudaShmTransport(SlotTransport):
    """Requests to one Triton server on this host, tensors through CUDA IPC memory on ``device``.

    Needs torch with CUDA and the server on this host with access to the same GPU. Requests
    with BYTES or variable-size tensors, or that find every slot busy, travel inline through
    ``self.grpc`` (inputs copied to the host).
    """

    name = "cuda"
    every_output = True

    def __init__(self, settings: ServerSettings | str, *, device: int = 0,
                 max_slots: int = DEFAULT_MAX_SLOTS) -> None:
        if not self.available():
            raise MissingDependencyError(
                "CudaShmTransport needs torch with a CUDA GPU and the CUDA driver; use "
                "SystemShmTransport for host arrays")
        super().__init__(settings, CudaRegions(device), max_slots)
        self.device = device

    @staticmethod
    def available() -> bool:
        """Whether torch sees a CUDA GPU and the driver library loads."""
        try:
            import torch

            if not torch.cuda.is_available():
                return False
            CudaDriver.get()
            return True
        except Exception:  # noqa: BLE001 - any failure means unavailable
            return False

    def __reduce__(self):
        return (_rebuild, (self.settings, self.device, self.max_slots))

    def infer_tensors(self, model: str, version: str, inputs: Mapping[str, Any],
                      outputs: Sequence[TensorInfo], *, rows: int | None = -1,
                      timeout_s: float = 60.0, as_numpy: bool = False) -> dict[str, Any]:
        """Run one request and wait; outputs as torch CUDA tensors (numpy with ``as_numpy``).

        ``outputs``: TensorInfo (or the zoo's TensorSpec). ``rows``: the batch size (default:
        the first input's first dim; None without batching).
        """
        outputs = tuple(t if isinstance(t, TensorInfo) else t.info for t in outputs)
        if rows == -1:
            first = next(iter(inputs.values()), None)
            rows = int(first.shape[0]) if first is not None and len(first.shape) else None
        request = InferRequest(model, version, dict(inputs), outputs, rows=rows,
                               timeout_s=timeout_s)
        return self._submit(request, not as_numpy).result().outputs

    def _message(self, request: InferRequest, slot: Slot, layout: Layout) -> Any:
        import torch

        message = slot_message(request, slot, layout)
        with torch.cuda.device(self.device):
            for name, value in request.inputs.items():
                offset, nbytes = layout.inputs[name]
                if isinstance(value, torch.Tensor):
                    slot.region.view(offset, value.dtype, value.shape).copy_(value,
                                                                             non_blocking=True)
                    dtype = numpy_dtype_of(value)
                else:
                    value = np.ascontiguousarray(value)
                    copy_host_to_device(value, slot.region.bytes[offset:offset + value.nbytes])
                    dtype = value.dtype
                tensor = message.inputs.add(name=name, datatype=triton_dtype(dtype),
                                            shape=tuple(value.shape))
                shm_parameters(tensor, slot.name, offset, nbytes)
            # the server reads the region from its own context: our copies must be finished
            torch.cuda.current_stream().synchronize()
        return message

    def _read(self, response: Any, request: InferRequest, slot: Slot, layout: Layout,
              keep_on_device: Any) -> InferAnswer:
        import torch

        outputs: dict[str, Any] = {}
        delivered = []
        received = 0
        with torch.cuda.device(self.device):
            for tensor in response.outputs:
                dtype, shape, offset = checked_output(tensor, layout, request.model)
                received += math.prod(shape) * dtype.itemsize
                view = slot.region.view(offset, dtype, shape)
                placed = _deliver(request, tensor.name, view, dtype)
                if placed is not None:
                    outputs[tensor.name] = placed
                    delivered.append(tensor.name)
                else:  # the one copy: out of the slot, into memory the caller owns
                    outputs[tensor.name] = view.clone() if keep_on_device else view.cpu().numpy()
        return InferAnswer(outputs, response.model_version, received, frozenset(delivered))

    def _inline(self, request: InferRequest, keep_on_device: Any) -> TransportFuture:
        """Send ``request`` in the gRPC message (host copies of its inputs)."""
        host = {name: value if isinstance(value, np.ndarray) else value.detach().cpu().numpy()
                for name, value in request.inputs.items()}
        out = request.out if all(isinstance(v, np.ndarray)
                                 for v in (request.out or {}).values()) else None
        inner = self.grpc.submit(dataclasses.replace(request, inputs=host, out=out))
        if not keep_on_device:
            return inner
        import torch

        future = TransportFuture(on_cancel=inner.cancel)

        def moved(done: Any) -> None:
            try:
                answer = done.result()
                answer.outputs = {name: torch.as_tensor(array).to(f"cuda:{self.device}")
                                  for name, array in answer.outputs.items()}
                future.resolve(answer)
            except BaseException as error:  # noqa: BLE001
                future.fail(error)

        inner.add_done_callback(moved)
        return future

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "device": self.device}


def _staging_pool() -> Any:
    from concurrent.futures import ThreadPoolExecutor

    return _copy_pools.get(STAGED_COPY_THREADS, lambda: ThreadPoolExecutor(
        STAGED_COPY_THREADS, thread_name_prefix="csonic-h2d"))


def copy_host_to_device(source: np.ndarray, target: Any) -> None:
    """Copy the C-contiguous ``source`` into the CUDA byte tensor ``target`` (same size) on the
    current stream, staged through pinned memory from :data:`STAGED_COPY_BYTES` on (why:
    docs/internals/transport-shm.md); returns when queued (synchronise the stream before use)."""
    import torch

    flat = source.reshape(-1).view(np.uint8)
    if flat.nbytes < STAGED_COPY_BYTES:
        target.copy_(torch.from_numpy(flat), non_blocking=True)
        return
    pinned = torch.empty(flat.nbytes, dtype=torch.uint8, pin_memory=True)
    staged = pinned.numpy()
    parts = STAGED_COPY_THREADS
    bounds = [flat.nbytes * part // parts for part in range(parts + 1)]
    pool = _staging_pool()
    copies = [pool.submit(np.copyto, staged[low:high], flat[low:high])
              for low, high in zip(bounds[:-1], bounds[1:])]
    for copy, low, high in zip(copies, bounds[:-1], bounds[1:]):
        copy.result()
        target[low:high].copy_(pinned[low:high], non_blocking=True)
    # torch's caching host allocator records the copies' stream: ``pinned`` is handed out again
    # only after they have run


def probe_cuda_shared_memory(grpc: Any, *, device: int = 0,
                             timeout_s: float = 5.0) -> tuple[bool, str]:
    """``(usable, why)``: whether this process can hand the server of ``grpc`` (a
    GrpcTransport, on this host) tensors in CUDA memory (a 4 KiB CUDA IPC region of ours)."""
    from tritonclient.grpc import service_pb2

    from ..errors import TransportError

    if not CudaShmTransport.available():
        return False, "this process has no CUDA (torch with a visible GPU and the driver)"
    region = CudaRegion(4096, device)
    try:
        try:
            grpc.rpc("CudaSharedMemoryRegister", CudaRegions(device).register_request(region),
                     timeout_s)
        except TransportError as error:
            return False, f"the server does not map our CUDA memory: {error.describe()}"
        try:
            grpc.rpc("CudaSharedMemoryUnregister",
                     service_pb2.CudaSharedMemoryUnregisterRequest(name=region.name), timeout_s)
        except TransportError as error:
            logger.debug("unregistering CUDA probe region %s: %s", region.name, error)
        return True, f"the server maps CUDA memory of GPU {device} of this process"
    finally:
        region.close()


def _deliver(request: InferRequest, name: str, view: Any, dtype: np.dtype) -> Any:
    """Copy a CUDA output ``view`` into ``request.out[name]`` (numpy or torch) when it fits, as
    :func:`~coffea_sonic.transport.base.deliver` does for host arrays; None when it does not."""
    import torch

    target = request.out.get(name) if request.out else None
    if target is None or request.rows is None or view.dim() == 0:
        return None
    shape = tuple(view.shape)
    if (shape[0] != request.rows or tuple(target.shape[1:]) != shape[1:]
            or target.shape[0] > shape[0]):
        return None
    rows = target.shape[0]
    if isinstance(target, torch.Tensor):
        if target.dtype != view.dtype:
            return None
        target.copy_(view[:rows])
    elif isinstance(target, np.ndarray) and np.can_cast(dtype, target.dtype, casting="safe"):
        if target.dtype == dtype:
            torch.from_numpy(target).copy_(view[:rows])  # one device -> host copy
        else:
            np.copyto(target, view[:rows].cpu().numpy(), casting="safe")
    else:
        return None
    return target


def _rebuild(settings: ServerSettings, device: int, max_slots: int) -> CudaShmTransport:
    return CudaShmTransport(settings, device=device, max_slots=max_slots)

