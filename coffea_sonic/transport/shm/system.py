"""Shared-memory transports to a Triton server on this host: tensors never cross the socket.

With the server on the same machine, a request's tensors are written once into a POSIX
shared-memory region that the server has mapped, and only a few hundred bytes of gRPC message
name the region, offset and size; the server writes the outputs into the same region. On the
project's CPU box this moves ~10x more bytes per second than sending the tensors in the gRPC
message (see ``benchmarks/transport/RESULTS-transport.md``).

* :class:`SystemShmTransport`: host (numpy) tensors through system shared memory.
* :class:`CudaShmTransport`: GPU (torch CUDA) tensors through CUDA IPC memory, where torch and a
  CUDA driver exist: inputs already on the local GPU never visit the host.
* :func:`select_transport`: ``"shm"`` when the server is on this host and can open our regions
  (a 4 KiB probe region is registered once per process and server), else ``"grpc"``.
* :func:`shared_transport`: the per-process transport of one server (one pool of regions shared
  by every model of a worker process; made lazily, after any fork).

Regions are created, reused and removed by the client, never leaked:

* a per-process pool of *slots* (one region each, at most ``max_slots``) is grown on demand; a
  request takes a free slot, so up to ``max_slots`` requests are in flight at once;
* a region's ``/dev/shm`` name is unlinked as soon as the server has mapped it (Triton maps a
  system region when it is registered), so nothing is left in ``/dev/shm`` even if this process is
  killed with SIGKILL; the memory is freed when both processes have unmapped it;
* regions are unregistered from the server on :meth:`close`, at interpreter exit (atexit), and
  when a request fails (server killed, timeout, cancel), after which the slot is dropped;
* registrations leaked by a client that died without unregistering (same host, same pid
  namespace, process gone) are unregistered the next time any client of this module connects.

Every call has the shape of TritonModel's requests, so TritonModel can send a piece through it:
:meth:`SystemShmTransport.submit` returns a :class:`TransportFuture` that behaves like the future
of ``stub.ModelInfer.future(request)``: ``result()`` is a ``ModelInferResponse`` whose
``raw_output_contents`` hold the outputs (decoded by ``codec.decode_response`` as usual), while
:meth:`TransportFuture.outputs` gives the ``{name: array}`` dict directly.

>>> select_transport("192.0.2.1:8001")  # TEST-NET address: never this host
'grpc'
>>> is_local_host("127.0.0.1"), is_local_host("192.0.2.1")
(True, False)

With a server on this host (``LocalTritonServer``)::

    transport = SystemShmTransport(server.grpc_address)
    outputs = transport.infer("jet_tagger", "", {"features": features},
                              [("probs", "FP32", (3,))], rows=len(features))
    transport.close()            # or leave it to atexit
"""

from __future__ import annotations

import atexit
import errno
import ipaddress
import itertools
import logging
import math
import mmap
import os
import re
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np

from ..errors import (ConfigurationError, InferenceError, MissingDependencyError,
                      ServerUnavailableError, SonicError)
from .channel import Connection, get_connection
from .codec import numpy_dtype, triton_dtype
from .status import as_sonic_error, describe

__all__ = [
    "CudaShmTransport", "OutputSpec", "SystemShmTransport", "TransportFuture", "TransportName",
    "close_all_transports", "is_local_host", "probe_system_shm", "region_prefix",
    "select_transport", "shared_transport", "sweep_stale_regions",
]

logger = logging.getLogger(__name__)

TransportName = Literal["shm", "grpc"]
#: Offsets of tensors inside a region are multiples of this (cache lines, and what GPUs like).
ALIGNMENT = 256
#: Smallest region a slot gets (grown on demand, in MiB steps with 1/8 headroom).
MIN_REGION_BYTES = 1 << 20
#: Default number of slots (regions, so requests in flight at once) per transport.
DEFAULT_MAX_SLOTS = 8
#: Name prefix of every region this module creates (``csonic-shm-<pidns>-<pid>-<token>-<n>``).
PREFIX = "csonic-shm"
#: Seconds a clean-up call to the server may take (at exit a dead server must not hang us).
CLEANUP_TIMEOUT_S = 2.0
_SHM_DETAILS = re.compile(r"shared memory|shared_memory", re.IGNORECASE)


# -- naming ------------------------------------------------------------------------------------------

def _pid_namespace() -> str:
    """The inode of this process' pid namespace (so a sweep never judges another namespace's pids)."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # 'pid:[4026531836]'
        return re.sub(r"\D", "", link) or "0"
    except OSError:
        return "0"


_NAMESPACE = _pid_namespace()
_serial = itertools.count()


def region_prefix(pid: int | None = None) -> str:
    """Name prefix of the regions of process ``pid`` (default: this one).

    >>> region_prefix(123).startswith("csonic-shm-") and region_prefix(123).endswith("-123-")
    True
    """
    return f"{PREFIX}-{_NAMESPACE}-{os.getpid() if pid is None else pid}-"


def _new_region_name() -> str:
    return f"{region_prefix()}{uuid.uuid4().hex[:8]}-{next(_serial)}"


def _pid_of(name: str) -> int | None:
    """The creator pid encoded in one of our region names of this namespace, else None."""
    match = re.match(rf"^{re.escape(PREFIX)}-{_NAMESPACE}-(\d+)-", name)
    return int(match.group(1)) if match else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _align(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


# -- where is the server -----------------------------------------------------------------------------

def _host_of(address: str) -> str:
    from .url import parse_address

    return parse_address(address)[0]


def is_local_host(host: str) -> bool:
    """Whether ``host`` (name or IP) is this machine: loopback, or an address we can bind to.

    >>> is_local_host("localhost")
    True
    """
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return False
    for family, _, _, _, sockaddr in infos:
        ip_text = str(sockaddr[0]).split("%")[0]
        try:
            if ipaddress.ip_address(ip_text).is_loopback:
                return True
        except ValueError:
            continue
        try:  # binding succeeds only for an address of one of this machine's interfaces
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.bind((sockaddr[0], 0))
            return True
        except OSError:
            continue
    return False


# -- one region --------------------------------------------------------------------------------------

class _Region:
    """One POSIX shared-memory region mapped into this process (created here, so owned here)."""

    def __init__(self, size: int) -> None:
        self.name = _new_region_name()
        self.size = size
        self.linked = False
        fd = _shm_open(self.name)
        self.linked = True
        try:
            try:
                # reserve the pages now: a full /dev/shm then fails here with ENOSPC instead of
                # killing the process with SIGBUS at the first write
                os.posix_fallocate(fd, 0, size)
            except AttributeError:  # platforms without posix_fallocate
                os.ftruncate(fd, size)
            self.mmap = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            self.unlink()
            raise
        os.close(fd)
        self.array = np.frombuffer(self.mmap, dtype=np.uint8)

    @property
    def key(self) -> str:
        return "/" + self.name

    def view(self, offset: int, dtype: np.dtype, shape: Sequence[int]) -> np.ndarray:
        """A numpy view of ``shape``/``dtype`` at byte ``offset`` (no copy)."""
        count = math.prod(shape)
        return self.array[offset: offset + count * dtype.itemsize].view(dtype).reshape(shape)

    def unlink(self) -> None:
        if self.linked:
            self.linked = False
            _shm_unlink(self.name)

    def close(self) -> None:
        self.unlink()
        self.array = None  # type: ignore[assignment]
        try:
            self.mmap.close()
        except BufferError:  # a caller still holds a view: the mapping goes with the last view
            logger.debug("region %s still has views; unmapped when they are gone", self.name)


def _shm_open(name: str) -> int:
    try:
        import _posixshmem

        return _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    except ImportError:
        return os.open(os.path.join("/dev/shm", name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)


def _shm_unlink(name: str) -> None:
    try:
        import _posixshmem

        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass
    except ImportError:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass


# -- output declarations ----------------------------------------------------------------------------

@dataclass(frozen=True)
class OutputSpec:
    """An output to ask for: name, Triton datatype, per-row dims (``-1`` = not known in advance).

    >>> OutputSpec.coerce(("probs", "FP32", (3,))).nbytes(rows=10)
    120
    >>> OutputSpec.coerce(("probs", "float32", [3])).datatype
    'FP32'
    >>> OutputSpec("n", "FP32", (-1,)).nbytes(rows=10) is None
    True
    """

    name: str
    datatype: str
    dims: tuple[int, ...]

    @classmethod
    def coerce(cls, value: Any) -> "OutputSpec":
        """From an ``OutputSpec``, a ``(name, datatype, dims)`` tuple, or anything with
        ``.name``/``.datatype``/``.dims`` (e.g. ``transport.metadata.TensorInfo``)."""
        if isinstance(value, OutputSpec):
            return value
        if isinstance(value, (tuple, list)):
            name, datatype, dims = value
        else:  # TensorInfo has .datatype; the zoo's TensorSpec has .triton_dtype
            datatype = getattr(value, "datatype", None) or getattr(value, "triton_dtype", None)
            name, dims = value.name, value.dims
        datatype = str(datatype).removeprefix("TYPE_")
        try:
            numpy_dtype(datatype)
        except InferenceError:  # a numpy name such as "float32"
            datatype = triton_dtype(np.dtype(datatype.lower()))
        return cls(str(name), datatype, tuple(int(d) for d in dims))

    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.datatype)

    def shape(self, rows: int | None) -> tuple[int, ...]:
        return ((rows,) if rows is not None else ()) + self.dims

    def nbytes(self, rows: int | None) -> int | None:
        """Bytes of this output for ``rows`` rows (``None``: the dims are full shapes), or None
        if not known in advance (variable dims, BYTES)."""
        if self.dtype == object or any(d < 0 for d in self.dims):
            return None
        return math.prod(self.shape(rows)) * self.dtype.itemsize


# -- futures -----------------------------------------------------------------------------------------

class TransportFuture:
    """The pending answer of one request; shaped like a gRPC future (a drop-in for TritonModel).

    ``result()`` gives a ``ModelInferResponse`` with ``raw_output_contents`` filled, ``outputs()``
    the ``{name: array}`` dict. On failure ``outputs()`` raises one of our errors, while
    ``exception()``/``result()`` give what a gRPC future would (the server's ``grpc.RpcError`` when
    there is one, so a caller's retry/overload classification works unchanged; else ours).
    Callbacks run once, in the thread that completes the request.

    >>> future = TransportFuture()
    >>> future._set_error(InferenceError("boom"))
    >>> type(future.exception()).__name__, future.done()
    ('InferenceError', True)
    """

    def __init__(self) -> None:
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[["TransportFuture"], None]] = []
        self._outputs: dict[str, np.ndarray] | None = None
        self._response: Any = None
        self._error: BaseException | None = None
        self._raw_error: BaseException | None = None
        self._cancelled = False
        self._cancel_hook: Callable[[], None] | None = None

    # completion (called by transports)
    def _set_outputs(self, outputs: dict[str, np.ndarray], response: Any) -> None:
        self._outputs, self._response = outputs, response
        self._finish()

    def _set_error(self, error: BaseException, raw: BaseException | None = None) -> None:
        self._error, self._raw_error = error, raw
        self._finish()

    def _finish(self) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # noqa: BLE001 - a caller's callback must not break the transport
                logger.exception("callback of a transport future failed")

    # the gRPC-future interface
    def add_done_callback(self, callback: Callable[["TransportFuture"], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def done(self) -> bool:
        return self._done.is_set()

    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> bool:
        """Stop waiting for the answer; the request's slot is dropped, never reused."""
        if self._done.is_set():
            return False
        self._cancelled = True
        if self._cancel_hook is not None:
            self._cancel_hook()
        self._set_error(InferenceError("request cancelled by the caller"))
        return True

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request not answered within {timeout} s")
        return self._raw_error or self._error

    def result(self, timeout: float | None = None) -> Any:
        """The ``ModelInferResponse`` (raw output contents filled in); raises the request's error."""
        error = self.exception(timeout)
        if error is not None:
            raise error
        if self._response is None or len(self._response.raw_output_contents) != len(
                self._response.outputs):
            self._response = _response_with_raw(self._response, self._outputs or {})
        return self._response

    def outputs(self, timeout: float | None = None) -> dict[str, np.ndarray]:
        """``{output name: array}`` (arrays owned by the caller); raises our error if it failed."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request not answered within {timeout} s")
        if self._error is not None:
            raise self._error
        return dict(self._outputs or {})


def _response_with_raw(response: Any, outputs: Mapping[str, np.ndarray]) -> Any:
    """A ``ModelInferResponse`` like ``response`` whose outputs travel as raw contents."""
    from tritonclient.grpc import service_pb2

    filled = service_pb2.ModelInferResponse()
    if response is not None:
        filled.model_name, filled.model_version, filled.id = (
            response.model_name, response.model_version, response.id)
    for name, array in outputs.items():
        tensor = filled.outputs.add()
        tensor.name = name
        tensor.datatype = triton_dtype(array.dtype)
        tensor.shape.extend(array.shape)
        filled.raw_output_contents.append(np.ascontiguousarray(array).tobytes())
    return filled


# -- request building shared by the shm transports --------------------------------------------------

def _new_request(model: str, version: str, request_id: str) -> Any:
    from tritonclient.grpc import service_pb2

    return service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)


def _add_tensor(container: Any, name: str, datatype: str | None, shape: Sequence[int] | None,
                region: str | None, offset: int, nbytes: int) -> Any:
    tensor = container.add()
    tensor.name = name
    if datatype is not None:
        tensor.datatype = datatype
    if shape is not None:
        tensor.shape.extend(shape)
    if region is not None:
        tensor.parameters["shared_memory_region"].string_param = region
        tensor.parameters["shared_memory_byte_size"].int64_param = nbytes
        if offset:
            tensor.parameters["shared_memory_offset"].int64_param = offset
    return tensor


def _is_rpc_error(error: BaseException) -> bool:
    code = getattr(error, "code", None)
    return callable(code) and not isinstance(error, SonicError)


def _batch_rows(inputs: Mapping[str, Any]) -> int | None:
    for array in inputs.values():
        shape = getattr(array, "shape", ())
        return int(shape[0]) if len(shape) else None
    return None


# -- the system shared-memory transport -------------------------------------------------------------

@dataclass(eq=False)
class _Slot:
    """One region and the server it is registered with."""

    region: _Region
    registered: bool = False


@dataclass(frozen=True)
class _Layout:
    """Where each tensor of one request sits in a slot's region."""

    inputs: tuple[tuple[str, int, int], ...]       # name, offset, nbytes
    outputs: tuple[tuple[OutputSpec, int, int], ...]  # spec, offset, nbytes
    total: int


def _plan(inputs: Mapping[str, np.ndarray], outputs: Sequence[OutputSpec],
          rows: int | None) -> _Layout:
    offset = 0
    placed_inputs = []
    for name, array in inputs.items():
        placed_inputs.append((name, offset, array.nbytes))
        offset = _align(offset + array.nbytes)
    placed_outputs = []
    for spec in outputs:
        nbytes = spec.nbytes(rows)
        placed_outputs.append((spec, offset, nbytes or 0))
        offset = _align(offset + (nbytes or 0))
    return _Layout(tuple(placed_inputs), tuple(placed_outputs), max(offset, 1))


class _PooledTransport:
    """What both shared-memory transports share: context manager, per-process connection, slots."""

    address: str
    _connection: Connection | None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def connection(self) -> Connection:
        if self._connection is None or self._connection.pid != os.getpid():
            self._connection = get_connection(self.address)
        return self._connection

    def regions(self) -> list[str]:
        """Names of the regions this transport holds now."""
        with self._condition:
            return sorted(slot.region.name for slot in (*self._free, *self._busy))


class SystemShmTransport(_PooledTransport):
    """Requests to one Triton server on this host, tensors through system shared memory.

    Parameters
    ----------
    address:
        ``host:port`` of the server's gRPC endpoint (must be this host).
    connection:
        The gRPC :class:`~coffea_sonic.transport.channel.Connection` to use (default: this
        process' pooled one for ``address``).
    metadata:
        gRPC metadata (resolved headers) for the region (un)registration calls.
    max_slots:
        Regions (= requests in flight at once); more requests wait for a free slot.
    copy_threads:
        Threads that copy one large input (>= 8 MiB) into its region in parallel (numpy
        releases the GIL while copying); 1 copies in the caller's thread only.

    A request whose tensors cannot be placed in shared memory (``/dev/shm`` full, BYTES tensors,
    outputs of unknown size) is still answered: those tensors travel in the gRPC message.

    >>> transport = SystemShmTransport("127.0.0.1:1")
    >>> transport.regions()
    []
    >>> transport.close()
    """

    kind = "shm"

    def __init__(self, address: str, *, connection: Connection | None = None,
                 metadata: Sequence[tuple[str, str]] = (), max_slots: int = DEFAULT_MAX_SLOTS,
                 copy_threads: int = 4) -> None:
        if not isinstance(max_slots, int) or max_slots < 1:
            raise ConfigurationError(f"max_slots must be an int >= 1, not {max_slots!r}")
        self.address = address
        self.metadata = tuple(metadata)
        self.max_slots = max_slots
        self.copy_threads = max(1, int(copy_threads))
        self._connection = connection
        self._pid = os.getpid()
        self._free: list[_Slot] = []
        self._busy: set[_Slot] = set()
        self._made = 0
        self._condition = threading.Condition()
        self._closed = False
        self._swept = False
        self._warned_fallback = False
        #: why shared memory is off for this transport (None: on)
        self._disabled: str | None = None
        self.stats = {"requests": 0, "shm_bytes": 0, "inline_requests": 0, "busy_fallbacks": 0,
                      "regions_made": 0, "regions_dropped": 0}
        _register_transport(self)

    def __repr__(self) -> str:
        return f"SystemShmTransport({self.address!r}, slots={self._made}/{self.max_slots})"

    def __reduce__(self):
        # configuration only: the receiving process makes its own regions
        return (_rebuild_system, (self.address, self.metadata, self.max_slots, self.copy_threads))

    # -- regions ------------------------------------------------------------------------------------
    def _register(self, slot: _Slot, timeout_s: float) -> None:
        from tritonclient.grpc import service_pb2

        region = slot.region
        if not self._swept:
            self._swept = True
            sweep_stale_regions(self.address, connection=self.connection, metadata=self.metadata)
        try:
            self.connection.stub.SystemSharedMemoryRegister(
                service_pb2.SystemSharedMemoryRegisterRequest(
                    name=region.name, key=region.key, offset=0, byte_size=region.size),
                timeout=timeout_s, metadata=self.metadata)
        except Exception as error:  # noqa: BLE001 - reported as ours below
            raise _region_error(error, self.address, region, "register") from None
        slot.registered = True
        # the server has mapped it: the name is no longer needed, and without it nothing can leak
        region.unlink()

    def _unregister(self, slot: _Slot) -> None:
        from tritonclient.grpc import service_pb2

        if not slot.registered:
            return
        slot.registered = False
        if os.getpid() != self._pid:
            return  # a forked child never touches its parent's registrations
        try:
            self.connection.stub.SystemSharedMemoryUnregister(
                service_pb2.SystemSharedMemoryUnregisterRequest(name=slot.region.name),
                timeout=CLEANUP_TIMEOUT_S, metadata=self.metadata)
        except Exception as error:  # noqa: BLE001 - a dead server has forgotten it anyway
            logger.debug("could not unregister %s at %s: %s", slot.region.name, self.address,
                         describe(error))

    def _drop(self, slot: _Slot) -> None:
        """Unregister and unmap a slot's region; the slot is never used again."""
        self._unregister(slot)
        slot.region.close()
        with self._condition:
            self._busy.discard(slot)
            self._made -= 1
            self.stats["regions_dropped"] += 1
            self._condition.notify()

    def _acquire(self, nbytes: int, timeout_s: float) -> _Slot | None:
        """A registered slot of at least ``nbytes`` (reused, grown or made), or None when all
        ``max_slots`` are busy.

        Never waits: requests are started from gRPC callback threads (TritonModel's window), and
        waiting there for a slot that only such a callback can free would deadlock. A request
        that finds no slot travels in the gRPC message instead (counted in ``stats``).
        """
        with self._condition:
            if self._closed:
                raise InferenceError(f"shared-memory transport to {self.address} is closed")
            if self._free:
                fitting = [slot for slot in self._free if slot.region.size >= nbytes]
                slot = fitting[0] if fitting else max(self._free, key=lambda s: s.region.size)
                self._free.remove(slot)
                self._busy.add(slot)
            elif self._made < self.max_slots:
                self._made += 1
                slot = None
            else:
                self.stats["busy_fallbacks"] += 1
                return None
        try:
            if slot is not None and slot.region.size >= nbytes:
                return slot
            if slot is not None:  # too small: replace it by a bigger one
                self._unregister(slot)
                slot.region.close()
                with self._condition:
                    self._busy.discard(slot)
            size = max(MIN_REGION_BYTES, -(-(nbytes + nbytes // 8) // MIN_REGION_BYTES)
                       * MIN_REGION_BYTES)
            fresh = _Slot(_Region(size))
            with self._condition:
                self._busy.add(fresh)
                self.stats["regions_made"] += 1
            try:
                self._register(fresh, timeout_s)
            except BaseException:
                fresh.region.close()
                with self._condition:
                    self._busy.discard(fresh)
                raise
            logger.debug("registered region %s (%d bytes) at %s", fresh.region.name, size,
                         self.address)
            return fresh
        except BaseException:
            with self._condition:
                self._made -= 1
            raise

    def _release(self, slot: _Slot) -> None:
        with self._condition:
            self._busy.discard(slot)
            if self._closed:
                closing = True
            else:
                closing = False
                self._free.append(slot)
                self._condition.notify()
        if closing:
            self._unregister(slot)
            slot.region.close()

    # -- requests -----------------------------------------------------------------------------------
    def infer(self, model: str, version: str, inputs: Mapping[str, np.ndarray],
              outputs: Iterable[Any], *, rows: int | None = -1, timeout_s: float = 60.0,
              metadata: Sequence[tuple[str, str]] = (), request_id: str = "") -> dict[str, np.ndarray]:
        """Run one request and wait: ``{output name: array}``. Arguments as :meth:`submit`."""
        return self.submit(model, version, inputs, outputs, rows=rows, timeout_s=timeout_s,
                           metadata=metadata, request_id=request_id).outputs()

    def submit(self, model: str, version: str, inputs: Mapping[str, np.ndarray],
               outputs: Iterable[Any], *, rows: int | None = -1, timeout_s: float = 60.0,
               metadata: Sequence[tuple[str, str]] = (), request_id: str = "") -> TransportFuture:
        """Send one request now; the returned future completes when the server has answered.

        ``inputs``: ``{name: array}`` with the exact dtypes the model declares (already
        validated, e.g. by TritonModel). ``outputs``: the outputs to return, as
        :class:`OutputSpec` coercibles (``TensorInfo``, ``(name, datatype, dims)``). ``rows``: the
        batch size when ``dims`` are per row (default: the first input's first dim), ``None`` when
        ``dims`` are full shapes (models without batching).
        """
        specs = [OutputSpec.coerce(spec) for spec in outputs]
        arrays = {name: np.asarray(array) for name, array in inputs.items()}
        if rows == -1:
            rows = _batch_rows(arrays)
        future = TransportFuture()
        self._send(future, model, version, arrays, specs, rows, timeout_s,
                   tuple(metadata) or self.metadata, request_id, retry=True)
        return future

    def _send(self, future: TransportFuture, model: str, version: str,
              arrays: dict[str, np.ndarray], specs: list[OutputSpec], rows: int | None,
              timeout_s: float, metadata: tuple, request_id: str, retry: bool) -> None:
        shm_inputs = {name: array for name, array in arrays.items()
                      if array.dtype != object and array.dtype.kind not in "SU"}
        shm_outputs = [spec for spec in specs if spec.nbytes(rows) is not None]
        layout = _plan(shm_inputs, shm_outputs, rows)
        slot: _Slot | None = None
        try:
            if self._disabled is None:
                try:
                    slot = self._acquire(layout.total, timeout_s)
                except (OSError, InferenceError) as error:
                    if isinstance(error, ServerUnavailableError) or (
                            isinstance(error, OSError) and not isinstance(error, SonicError)
                            and error.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EACCES,
                                                    errno.EPERM)):
                        raise
                    self._note_fallback(error)
            if slot is None:
                layout, shm_inputs, shm_outputs = _plan({}, [], rows), {}, []
            request = _new_request(model, version, request_id)
            for name, array in arrays.items():
                if slot is not None and name in shm_inputs:
                    _, offset, nbytes = next(p for p in layout.inputs if p[0] == name)
                    self._copy_in(slot.region.view(offset, array.dtype, array.shape), array)
                    _add_tensor(request.inputs, name, triton_dtype(array.dtype), array.shape,
                                slot.region.name, offset, nbytes)
                else:
                    from .codec import _raw_bytes

                    _add_tensor(request.inputs, name, triton_dtype(array.dtype), array.shape,
                                None, 0, 0)
                    request.raw_input_contents.append(_raw_bytes(array))
            if request.raw_input_contents and slot is not None and len(
                    request.raw_input_contents) != len(request.inputs):
                # Triton takes raw contents for all inputs or none: put the rest inline too
                request = self._all_inline(model, version, arrays, request_id)
            for spec, offset, nbytes in layout.outputs:
                _add_tensor(request.outputs, spec.name, None, None,
                            slot.region.name if slot is not None else None, offset, nbytes)
            for spec in specs:
                if slot is None or spec not in shm_outputs:
                    _add_tensor(request.outputs, spec.name, None, None, None, 0, 0)
            call = self.connection.stub.ModelInfer.future(request, timeout=timeout_s,
                                                          metadata=metadata)
        except BaseException as error:
            if slot is not None:
                self._release(slot)
            future._set_error(as_sonic_error(error, model=model, version=version,
                                             address=self.address)
                              if not isinstance(error, (ConfigurationError, InferenceError,
                                                        ServerUnavailableError)) else error,
                              raw=error if _is_rpc_error(error) else None)
            return
        with self._condition:
            self.stats["requests"] += 1
            if slot is None:
                self.stats["inline_requests"] += 1
            else:
                self.stats["shm_bytes"] += sum(p[2] for p in layout.inputs)
        future._cancel_hook = call.cancel
        call.add_done_callback(
            lambda done: self._on_answer(done, future, slot, layout, model, version, arrays,
                                         specs, rows, timeout_s, metadata, request_id, retry))

    def _all_inline(self, model: str, version: str, arrays: Mapping[str, np.ndarray],
                    request_id: str) -> Any:
        from .codec import encode_request

        return encode_request(model, version, arrays, request_id=request_id)

    def _copy_in(self, target: np.ndarray, source: np.ndarray) -> None:
        threads = self.copy_threads
        if threads == 1 or source.nbytes < (8 << 20) or source.ndim == 0 or len(source) < threads:
            np.copyto(target, source, casting="no")
            return
        bounds = np.linspace(0, len(source), threads + 1).astype(int)
        pool = _copy_pool(threads)
        jobs = [pool.submit(np.copyto, target[a:b], source[a:b], casting="no")
                for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        for job in jobs:
            job.result()

    def _note_fallback(self, error: BaseException) -> None:
        # a server that cannot map our regions (or a full /dev/shm) will not change its mind:
        # stop trying, and send every later request in the gRPC message
        self._disabled = f"{type(error).__name__}: {error}"
        if not self._warned_fallback:
            self._warned_fallback = True
            logger.warning("shared memory unavailable for %s (%s); sending tensors in the gRPC "
                           "message instead. Make /dev/shm larger to use shared memory.",
                           self.address, error)

    def _on_answer(self, call: Any, future: TransportFuture, slot: _Slot | None, layout: _Layout,
                   model: str, version: str, arrays: dict[str, np.ndarray],
                   specs: list[OutputSpec], rows: int | None, timeout_s: float, metadata: tuple,
                   request_id: str, retry: bool) -> None:
        if future.done():  # cancelled by the caller: the server may still write into the slot
            if slot is not None:
                self._drop(slot)
            return
        error = call.exception() if not call.cancelled() else InferenceError("request cancelled")
        if error is not None:
            if slot is not None:
                # a failed request may still be writing (timeout) or the server may have lost
                # its registration (restart): never reuse this region
                self._drop(slot)
            details = describe(error)
            if retry and slot is not None and _SHM_DETAILS.search(details):
                logger.info("server %s lost shared-memory region (%s); registering a new one",
                            self.address, details)
                self._send(future, model, version, arrays, specs, rows, timeout_s, metadata,
                           request_id, retry=False)
                return
            future._set_error(as_sonic_error(error, model=model, version=version,
                                             address=self.address),
                              raw=error if _is_rpc_error(error) else None)
            return
        try:
            response = call.result()
            outputs = self._read_outputs(response, slot, layout, model)
        except BaseException as error:  # noqa: BLE001 - surfaced through the future
            if slot is not None:
                self._release(slot)
            future._set_error(error if isinstance(error, InferenceError) else InferenceError(
                f"model {model!r} at {self.address}: cannot read the answer "
                f"({type(error).__name__}: {error})"))
            return
        if slot is not None:
            self._release(slot)
        future._set_outputs(outputs, None)

    def _read_outputs(self, response: Any, slot: _Slot | None, layout: _Layout,
                      model: str) -> dict[str, np.ndarray]:
        placed = {spec.name: (spec, offset, nbytes) for spec, offset, nbytes in layout.outputs}
        raw = list(response.raw_output_contents)
        outputs: dict[str, np.ndarray] = {}
        for index, tensor in enumerate(response.outputs):
            dtype = numpy_dtype(tensor.datatype)
            shape = tuple(tensor.shape)
            if slot is not None and tensor.name in placed:
                _, offset, reserved = placed[tensor.name]
                nbytes = math.prod(shape) * dtype.itemsize
                if nbytes > reserved:
                    raise InferenceError(
                        f"model {model!r} output {tensor.name!r}: server answered shape "
                        f"{list(shape)} {tensor.datatype} ({nbytes} bytes) but {reserved} bytes "
                        "were reserved from the declared dims; the served model does not match "
                        "its declaration")
                outputs[tensor.name] = slot.region.view(offset, dtype, shape).copy()
            else:
                content = raw[index] if index < len(raw) else b""
                if dtype == object:
                    from tritonclient.utils import deserialize_bytes_tensor

                    outputs[tensor.name] = deserialize_bytes_tensor(content).reshape(shape)
                else:
                    outputs[tensor.name] = np.frombuffer(content, dtype=dtype).reshape(shape)
        return outputs

    # -- life cycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Unregister and unmap every region (requests in flight release theirs when done)."""
        with self._condition:
            self._closed = True
            free, self._free = self._free, []
            self._made -= len(free)
            self._condition.notify_all()
        for slot in free:
            self._unregister(slot)
            slot.region.close()
        _unregister_transport(self)


def _rebuild_system(address: str, metadata: tuple, max_slots: int,
                    copy_threads: int) -> SystemShmTransport:
    return SystemShmTransport(address, metadata=metadata, max_slots=max_slots,
                              copy_threads=copy_threads)


def _region_error(error: BaseException, address: str, region: Any, action: str) -> BaseException:
    text = describe(error)
    lowered = text.lower()
    if "unavailable" in lowered or "connection" in lowered or "deadline" in lowered:
        return ServerUnavailableError(
            f"cannot {action} shared-memory region {region.name} ({region.size} bytes) at Triton "
            f"{address}: {text}; is the server running?")
    return InferenceError(
        f"Triton at {address} cannot {action} shared-memory region {region.name} "
        f"({region.size} bytes): {text}. Shared memory needs the server on this host with the "
        "same /dev/shm (not in a separate container) and enough room in it; use the gRPC "
        "transport otherwise")


_copy_pools: dict[int, Any] = {}
_copy_pools_lock = threading.Lock()


def _copy_pool(threads: int):
    from concurrent.futures import ThreadPoolExecutor

    with _copy_pools_lock:
        pool = _copy_pools.get(threads)
        if pool is None:
            pool = _copy_pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="csonic-copy")
        return pool


# -- leaked registrations of dead clients ------------------------------------------------------------

def sweep_stale_regions(address: str, *, connection: Connection | None = None,
                        metadata: Sequence[tuple[str, str]] = (), timeout_s: float = 5.0) -> list[str]:
    """Unregister (at ``address``) and unlink (in ``/dev/shm``) regions of clients that died.

    Only regions of this module, created in this pid namespace by a process that no longer
    exists, are touched. Returns the names removed.
    """
    from tritonclient.grpc import service_pb2

    removed: list[str] = []
    for name in _dev_shm_names():
        pid = _pid_of(name)
        if pid is not None and not _alive(pid):
            _shm_unlink(name)
            removed.append(name)
    connection = connection or get_connection(address)
    try:
        status = connection.stub.SystemSharedMemoryStatus(
            service_pb2.SystemSharedMemoryStatusRequest(), timeout=timeout_s, metadata=metadata)
    except Exception as error:  # noqa: BLE001 - nothing to sweep on a server we cannot ask
        logger.debug("cannot list shared-memory regions at %s: %s", address, describe(error))
        return removed
    for name in list(status.regions):
        pid = _pid_of(name)
        if pid is None or _alive(pid):
            continue
        try:
            connection.stub.SystemSharedMemoryUnregister(
                service_pb2.SystemSharedMemoryUnregisterRequest(name=name), timeout=timeout_s,
                metadata=metadata)
            removed.append(name)
            logger.info("unregistered region %s of dead client %d at %s", name, pid, address)
        except Exception as error:  # noqa: BLE001
            logger.debug("cannot unregister stale %s at %s: %s", name, address, describe(error))
    return removed


def _dev_shm_names() -> list[str]:
    try:
        return [name for name in os.listdir("/dev/shm") if name.startswith(PREFIX + "-")]
    except OSError:
        return []


# -- choosing a transport ----------------------------------------------------------------------------

_probe_cache: dict[tuple[int, str], bool] = {}
_probe_lock = threading.Lock()


def probe_system_shm(address: str, *, connection: Connection | None = None,
                     metadata: Sequence[tuple[str, str]] = (), timeout_s: float = 5.0) -> bool:
    """Whether the server at ``address`` can map a region this process creates (cached).

    Registers and unregisters a 4 KiB region; any failure (other host, other ``/dev/shm``,
    permissions, an old server) means no.
    """
    from tritonclient.grpc import service_pb2

    key = (os.getpid(), address)
    with _probe_lock:
        if key in _probe_cache:
            return _probe_cache[key]
    connection = connection or get_connection(address)
    try:
        region = _Region(4096)
    except OSError as error:
        logger.info("no POSIX shared memory on this host (%s): using gRPC to %s", error, address)
        return False
    answer = False
    try:
        connection.stub.SystemSharedMemoryRegister(
            service_pb2.SystemSharedMemoryRegisterRequest(
                name=region.name, key=region.key, offset=0, byte_size=region.size),
            timeout=timeout_s, metadata=tuple(metadata))
        answer = True
        connection.stub.SystemSharedMemoryUnregister(
            service_pb2.SystemSharedMemoryUnregisterRequest(name=region.name),
            timeout=timeout_s, metadata=tuple(metadata))
    except Exception as error:  # noqa: BLE001 - any failure: no shared memory with this server
        text = describe(error)
        if "UNAVAILABLE" in text or "DEADLINE" in text:
            region.close()
            raise ServerUnavailableError(
                f"cannot reach Triton at {address} to probe shared memory: {text}") from None
        logger.info("Triton at %s cannot map this host's shared memory (%s): using gRPC",
                    address, text)
    finally:
        region.close()
    with _probe_lock:
        _probe_cache[key] = answer
    return answer


def select_transport(address: str, requested: str = "auto", *,
                     connection: Connection | None = None,
                     metadata: Sequence[tuple[str, str]] = ()) -> TransportName:
    """``"shm"`` or ``"grpc"`` for the server at ``address`` (``host:port``).

    ``requested``: ``"grpc"`` always gives gRPC; ``"shm"`` demands shared memory
    (``ConfigurationError`` if the server is elsewhere or cannot map our regions); ``"auto"``
    picks shared memory when the server is on this host and the probe succeeds, and gRPC when the
    server is elsewhere or cannot be reached right now (the call then reports the real error).

    >>> select_transport("192.0.2.1:8001", "grpc")
    'grpc'
    """
    if requested not in ("auto", "shm", "grpc"):
        raise ConfigurationError(f"transport must be 'auto', 'shm' or 'grpc', not {requested!r}")
    if requested == "grpc":
        return "grpc"
    key = (os.getpid(), address, requested)
    chosen = _selections.get(key)  # asked per request: name lookups and probes only once
    if chosen is None:
        chosen = _select(address, requested, connection, metadata)
        if chosen is not None:
            _selections[key] = chosen
    return chosen or "grpc"


_selections: dict[tuple[int, str, str], TransportName] = {}


def _select(address: str, requested: str, connection: Connection | None,
            metadata: Sequence[tuple[str, str]]) -> TransportName | None:
    """The choice of :func:`select_transport`, or None (gRPC for now) if the server is down."""
    local = is_local_host(_host_of(address))
    if not local:
        if requested == "shm":
            raise ConfigurationError(
                f"transport='shm' needs the Triton server on this host, but {address} is not a "
                "local address; use transport='auto' or 'grpc'")
        return "grpc"
    try:
        usable = probe_system_shm(address, connection=connection, metadata=metadata)
    except ServerUnavailableError:
        if requested == "shm":
            raise
        return None  # decide again once it is up
    if requested == "shm" and not usable:
        raise ConfigurationError(
            f"transport='shm': Triton at {address} cannot map this process' shared memory "
            "(server in another container or /dev/shm namespace, or shared memory disabled); "
            "use transport='auto' or 'grpc'")
    return "shm" if usable else "grpc"


# -- per-process registry ------------------------------------------------------------------------------

_transports: dict[int, Any] = {}
_shared: dict[tuple, Any] = {}
_registry_lock = threading.RLock()
# Transports inherited from a parent process: kept referenced, never closed from the child.
_inherited: list[Any] = []


def _register_transport(transport: Any) -> None:
    with _registry_lock:
        _transports[id(transport)] = transport


def _unregister_transport(transport: Any) -> None:
    with _registry_lock:
        _transports.pop(id(transport), None)
        for key, value in list(_shared.items()):
            if value is transport:
                del _shared[key]


def _after_fork_in_child() -> None:
    global _registry_lock
    _inherited.extend(_transports.values())
    # copies keep the parent's objects alive here: no finalizer of theirs may run in the child
    _inherited.extend([dict(_shared), dict(_probe_cache), dict(_selections)])
    _transports.clear()
    _shared.clear()
    _probe_cache.clear()
    _selections.clear()
    _registry_lock = threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def shared_transport(address: str, kind: str = "shm", *,
                     metadata: Sequence[tuple[str, str]] = (), headers_fingerprint: str = "",
                     connection: Connection | None = None) -> Any:
    """This process' transport of ``kind`` (``"shm"`` or ``"cuda"``) to ``address``.

    Every model of a worker process shares its slots (made lazily, after any fork).

    >>> shared_transport("127.0.0.1:1") is shared_transport("127.0.0.1:1")
    True
    """
    key = (os.getpid(), address, kind, headers_fingerprint)
    with _registry_lock:
        transport = _shared.get(key)
        if transport is None:
            if kind == "shm":
                transport = SystemShmTransport(address, connection=connection, metadata=metadata)
            elif kind == "cuda":
                transport = CudaShmTransport(address, connection=connection, metadata=metadata)
            else:
                raise ConfigurationError(f"shared transport kind must be 'shm' or 'cuda', not {kind!r}")
            _shared[key] = transport
        return transport


def close_all_transports() -> None:
    """Close every shared-memory transport of this process (runs at interpreter exit)."""
    with _registry_lock:
        transports = list(_transports.values())
    for transport in transports:
        if getattr(transport, "_pid", os.getpid()) != os.getpid():
            continue
        try:
            transport.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            logger.debug("closing %r failed", transport, exc_info=True)


atexit.register(close_all_transports)


# -- CUDA shared memory ------------------------------------------------------------------------------

class _CudaDriver:
    """The few CUDA driver calls CUDA IPC regions need (libcuda through ctypes)."""

    _instance: "_CudaDriver | None" = None

    def __init__(self) -> None:
        import ctypes

        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise MissingDependencyError(
                f"CUDA shared memory needs the CUDA driver (libcuda.so.1): {error}") from None
        self.ctypes = ctypes

    @classmethod
    def get(cls) -> "_CudaDriver":
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


class _CudaRegion:
    """One device allocation (its own ``cuMemAlloc``, so its IPC handle starts at offset 0)."""

    def __init__(self, size: int, device: int) -> None:
        import torch

        self.name = _new_region_name()
        self.size = size
        self.device = device
        driver = _CudaDriver.get()
        torch.cuda.init()
        with torch.cuda.device(device):
            driver.make_current(device)
            self.pointer = driver.alloc(size)
            self.handle = driver.ipc_handle(self.pointer)
        self.bytes = torch.as_tensor(_CudaArray(self.pointer, size), device=f"cuda:{device}")

    def view(self, offset: int, dtype: Any, shape: Sequence[int]) -> Any:
        import torch

        dtype = _torch_dtype(dtype)
        itemsize = torch.empty((), dtype=dtype).element_size()
        count = math.prod(shape)
        return self.bytes[offset: offset + count * itemsize].view(dtype).view(tuple(shape))

    def close(self) -> None:
        if self.pointer:
            self.bytes = None
            driver = _CudaDriver.get()
            driver.make_current(self.device)
            driver.free(self.pointer)
            self.pointer = 0


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    return {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
            np.dtype(np.float16): torch.float16, np.dtype(np.int64): torch.int64,
            np.dtype(np.int32): torch.int32, np.dtype(np.int16): torch.int16,
            np.dtype(np.int8): torch.int8, np.dtype(np.uint8): torch.uint8,
            np.dtype(bool): torch.bool}[np.dtype(dtype)]


def _numpy_dtype_of(tensor: Any) -> np.dtype:
    import torch

    return {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
            torch.float16: np.dtype(np.float16), torch.int64: np.dtype(np.int64),
            torch.int32: np.dtype(np.int32), torch.int16: np.dtype(np.int16),
            torch.int8: np.dtype(np.int8), torch.uint8: np.dtype(np.uint8),
            torch.bool: np.dtype(bool)}[tensor.dtype]


class CudaShmTransport(_PooledTransport):
    """Requests to one Triton server on this host, tensors through CUDA IPC memory on ``device``.

    For inputs that already live on the local GPU (torch CUDA tensors): each slot is a device
    allocation registered once with the server (``CudaSharedMemoryRegister``); a request copies its
    inputs device-to-device into the slot and the server reads them there, so they never cross
    PCIe to the host. Host inputs (numpy) are copied to the device first. :meth:`infer` returns
    torch CUDA tensors (``as_numpy=True``: numpy); the futures of :meth:`submit` give what
    :class:`TransportFuture` does (host arrays), so TritonModel can use it too.

    Needs torch with CUDA and the server on this host with access to the same GPU.

    >>> CudaShmTransport.available()  # doctest: +SKIP
    True
    """

    kind = "cuda"

    def __init__(self, address: str, *, device: int = 0, connection: Connection | None = None,
                 metadata: Sequence[tuple[str, str]] = (),
                 max_slots: int = DEFAULT_MAX_SLOTS) -> None:
        if not self.available():
            raise MissingDependencyError(
                "CudaShmTransport needs torch with a CUDA GPU and the CUDA driver; use "
                "SystemShmTransport for host arrays")
        self.address = address
        self.device = device
        self.metadata = tuple(metadata)
        self.max_slots = max_slots
        self._connection = connection
        self._pid = os.getpid()
        self._free: list[Any] = []
        self._busy: set[Any] = set()
        self._made = 0
        self._condition = threading.Condition()
        self._closed = False
        self.stats = {"requests": 0, "cuda_bytes": 0, "regions_made": 0}
        _register_transport(self)

    @staticmethod
    def available() -> bool:
        """Whether torch sees a CUDA GPU and the driver library loads."""
        try:
            import torch

            if not torch.cuda.is_available():
                return False
            _CudaDriver.get()
            return True
        except Exception:  # noqa: BLE001 - any failure means unavailable
            return False

    def __repr__(self) -> str:
        return f"CudaShmTransport({self.address!r}, device={self.device})"

    def _acquire(self, nbytes: int, timeout_s: float) -> _Slot | None:
        """A registered slot of at least ``nbytes``, or None when all are busy (never waits,
        for the reason given in :meth:`SystemShmTransport._acquire`)."""
        from tritonclient.grpc import service_pb2

        too_small = None
        with self._condition:
            if self._closed:
                raise InferenceError(f"CUDA shared-memory transport to {self.address} is closed")
            fitting = [slot for slot in self._free if slot.region.size >= nbytes]
            if fitting:
                self._free.remove(fitting[0])
                self._busy.add(fitting[0])
                return fitting[0]
            if self._free:  # too small: replaced by a bigger one below
                too_small = self._free.pop()
            elif self._made < self.max_slots:
                self._made += 1
            else:
                return None
        if too_small is not None:
            self._forget(too_small)
        try:
            size = max(MIN_REGION_BYTES, -(-(nbytes + nbytes // 8) // MIN_REGION_BYTES)
                       * MIN_REGION_BYTES)
            region = _CudaRegion(size, self.device)
            try:
                self.connection.stub.CudaSharedMemoryRegister(
                    service_pb2.CudaSharedMemoryRegisterRequest(
                        name=region.name, raw_handle=region.handle, device_id=self.device,
                        byte_size=size), timeout=timeout_s, metadata=self.metadata)
            except Exception as error:  # noqa: BLE001
                region.close()
                raise _region_error(error, self.address, region, "register CUDA") from None
            slot = _Slot(region, registered=True)  # type: ignore[arg-type]
            with self._condition:
                self._busy.add(slot)
                self.stats["regions_made"] += 1
            return slot
        except BaseException:
            with self._condition:
                self._made -= 1
            raise

    def _forget(self, slot: _Slot) -> None:
        from tritonclient.grpc import service_pb2

        if slot.registered and os.getpid() == self._pid:
            slot.registered = False
            try:
                self.connection.stub.CudaSharedMemoryUnregister(
                    service_pb2.CudaSharedMemoryUnregisterRequest(name=slot.region.name),
                    timeout=CLEANUP_TIMEOUT_S, metadata=self.metadata)
            except Exception as error:  # noqa: BLE001
                logger.debug("cannot unregister %s: %s", slot.region.name, describe(error))
        if os.getpid() == self._pid:
            slot.region.close()

    def _release(self, slot: _Slot, drop: bool = False) -> None:
        if slot is None:
            return
        with self._condition:
            self._busy.discard(slot)
            if drop or self._closed:
                self._made -= 1
            else:
                self._free.append(slot)
            self._condition.notify()
        if drop or self._closed:
            self._forget(slot)

    def infer(self, model: str, version: str, inputs: Mapping[str, Any], outputs: Iterable[Any],
              *, rows: int | None = -1, timeout_s: float = 60.0,
              metadata: Sequence[tuple[str, str]] = (), request_id: str = "",
              as_numpy: bool = False) -> dict[str, Any]:
        """Run one request and wait; outputs as torch CUDA tensors (or numpy with ``as_numpy``)."""
        future = self.submit(model, version, inputs, outputs, rows=rows, timeout_s=timeout_s,
                             metadata=metadata, request_id=request_id, keep_on_device=not as_numpy)
        return future.outputs()

    def submit(self, model: str, version: str, inputs: Mapping[str, Any], outputs: Iterable[Any],
               *, rows: int | None = -1, timeout_s: float = 60.0,
               metadata: Sequence[tuple[str, str]] = (), request_id: str = "",
               keep_on_device: bool = False) -> TransportFuture:
        """Send one request now (inputs: torch tensors on any device, or numpy arrays)."""
        import torch

        specs = [OutputSpec.coerce(spec) for spec in outputs]
        tensors = {name: value if isinstance(value, torch.Tensor) else torch.from_numpy(
            np.ascontiguousarray(value)) for name, value in inputs.items()}
        if rows == -1:
            rows = _batch_rows(tensors)
        future = TransportFuture()
        placed_inputs = []
        offset = 0
        for name, tensor in tensors.items():
            placed_inputs.append((name, offset, tensor.numel() * tensor.element_size()))
            offset = _align(offset + placed_inputs[-1][2])
        placed_outputs = []
        for spec in specs:
            nbytes = spec.nbytes(rows)
            if nbytes is None:
                future._set_error(InferenceError(
                    f"model {model!r} output {spec.name!r} has no fixed size ({spec.datatype} "
                    f"{list(spec.dims)}); CUDA shared memory needs fixed-size outputs"))
                return future
            placed_outputs.append((spec, offset, nbytes))
            offset = _align(offset + nbytes)
        metadata = tuple(metadata) or self.metadata
        slot = None
        try:
            slot = self._acquire(max(offset, 1), timeout_s)
            if slot is None:  # every slot busy: this request goes through the host
                from .codec import encode_request

                host = {name: tensor.detach().cpu().numpy() for name, tensor in tensors.items()}
                return _inline_future(self.connection, encode_request(
                    model, version, host, request_id=request_id), model, version, self.address,
                    timeout_s, metadata, keep_on_device, self.device)
            region = slot.region
            request = _new_request(model, version, request_id)
            with torch.cuda.device(self.device):
                for (name, start, nbytes) in placed_inputs:
                    tensor = tensors[name]
                    region.view(start, tensor.dtype, tensor.shape).copy_(tensor, non_blocking=True)
                    _add_tensor(request.inputs, name, triton_dtype(_numpy_dtype_of(tensor)),
                                tuple(tensor.shape), region.name, start, nbytes)
                # the server reads the region from its own context: our copies must be finished
                torch.cuda.current_stream().synchronize()
            for spec, start, nbytes in placed_outputs:
                _add_tensor(request.outputs, spec.name, None, None, region.name, start, nbytes)
            call = self.connection.stub.ModelInfer.future(request, timeout=timeout_s,
                                                          metadata=metadata)
        except BaseException as error:
            if slot is not None:
                self._release(slot)
            future._set_error(error if isinstance(error, (InferenceError, ServerUnavailableError,
                                                          MissingDependencyError))
                              else as_sonic_error(error, model=model, version=version,
                                                  address=self.address))
            return future
        with self._condition:
            self.stats["requests"] += 1
            self.stats["cuda_bytes"] += sum(p[2] for p in placed_inputs)
        future._cancel_hook = call.cancel

        def on_answer(done: Any) -> None:
            if future.done():
                self._release(slot, drop=True)
                return
            error = done.exception() if not done.cancelled() else InferenceError("cancelled")
            if error is not None:
                self._release(slot, drop=True)
                future._set_error(as_sonic_error(error, model=model, version=version,
                                                 address=self.address),
                                  raw=error if _is_rpc_error(error) else None)
                return
            try:
                response = done.result()
                results: dict[str, Any] = {}
                reserved = {spec.name: (start, nbytes) for spec, start, nbytes in placed_outputs}
                for tensor in response.outputs:
                    start, nbytes = reserved[tensor.name]
                    dtype = numpy_dtype(tensor.datatype)
                    shape = tuple(tensor.shape)
                    if math.prod(shape) * dtype.itemsize > nbytes:
                        raise InferenceError(
                            f"model {model!r} output {tensor.name!r}: shape {list(shape)} "
                            f"exceeds the {nbytes} bytes reserved from its declared dims")
                    view = slot.region.view(start, dtype, shape)
                    results[tensor.name] = view.clone() if keep_on_device else view.cpu().numpy()
            except BaseException as failure:  # noqa: BLE001
                self._release(slot)
                future._set_error(failure if isinstance(failure, InferenceError) else
                                  InferenceError(f"model {model!r}: cannot read the answer: {failure}"))
                return
            self._release(slot)
            future._set_outputs(results, None)

        call.add_done_callback(on_answer)
        return future

    def close(self) -> None:
        """Unregister and free every region (requests in flight free theirs when done)."""
        with self._condition:
            self._closed = True
            free, self._free = self._free, []
            self._made -= len(free)
        for slot in free:
            self._forget(slot)
        _unregister_transport(self)


def _inline_future(connection: Connection, request: Any, model: str, version: str, address: str,
                   timeout_s: float, metadata: tuple, keep_on_device: bool,
                   device: int) -> TransportFuture:
    """Send an already encoded request (tensors in the message) and wrap its answer."""
    from .codec import decode_response

    future = TransportFuture()
    call = connection.stub.ModelInfer.future(request, timeout=timeout_s, metadata=metadata)
    future._cancel_hook = call.cancel

    def on_answer(done: Any) -> None:
        if future.done():
            return
        error = done.exception() if not done.cancelled() else InferenceError("cancelled")
        if error is not None:
            future._set_error(as_sonic_error(error, model=model, version=version, address=address),
                              raw=error if _is_rpc_error(error) else None)
            return
        response = done.result()
        outputs: dict[str, Any] = {name: array.copy() for name, array in decode_response(response).items()}
        if keep_on_device:
            import torch

            outputs = {name: torch.from_numpy(array).to(f"cuda:{device}")
                       for name, array in outputs.items()}
        future._set_outputs(outputs, response)

    call.add_done_callback(on_answer)
    return future
