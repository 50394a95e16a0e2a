"""POSIX shared-memory regions: names, mapping, sweeps (docs/internals/transport-shm.md)."""

from __future__ import annotations

import ipaddress
import itertools
import logging
import math
import mmap
import os
import re
import socket
import uuid
from typing import Any, Sequence

import numpy as np

from ...core.endpoint import ServerSettings, parse_address
from ..errors import TransportError

__all__ = [
    "ALIGNMENT", "MIN_REGION_BYTES", "PREFIX", "SystemRegion", "align", "host_of",
    "is_local_host", "new_region_name", "pid_alive", "pid_of", "region_prefix", "region_size",
    "stale_names", "sweep_stale_regions", "unlink_name",
]

logger = logging.getLogger(__name__)

#: Offsets of tensors inside a region are multiples of this (cache lines, and what GPUs like).
ALIGNMENT = 256
#: Smallest region a slot gets (grown on demand, in MiB steps with 1/8 headroom).
MIN_REGION_BYTES = 1 << 20
#: Name prefix of every region this package creates.
PREFIX = "csonic-shm"


# -- naming ------------------------------------------------------------------------------------------

def _pid_namespace() -> str:
    """The inode of this process' pid namespace (a sweep never judges another namespace's pids)."""
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


def new_region_name() -> str:
    """A fresh region name of this process (unique across processes and calls)."""
    return f"{region_prefix()}{uuid.uuid4().hex[:8]}-{next(_serial)}"


def pid_of(name: str) -> int | None:
    """The creator pid in one of our region names of this pid namespace, else None.

    >>> pid_of(region_prefix(42) + "ab-1"), pid_of("someone-else")
    (42, None)
    """
    match = re.match(rf"^{re.escape(PREFIX)}-{_NAMESPACE}-(\d+)-", name)
    return int(match.group(1)) if match else None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (in this pid namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def align(offset: int) -> int:
    """``offset`` rounded up to :data:`ALIGNMENT`."""
    return -(-offset // ALIGNMENT) * ALIGNMENT


def region_size(nbytes: int) -> int:
    """Bytes to allocate for a request of ``nbytes``: whole MiB, 1/8 headroom, at least 1 MiB."""
    wanted = nbytes + nbytes // 8
    return max(MIN_REGION_BYTES, -(-wanted // MIN_REGION_BYTES) * MIN_REGION_BYTES)


# -- where is the server -----------------------------------------------------------------------------

def host_of(address: str) -> str:
    """The host part of ``host:port``."""
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

def _shm_open(name: str) -> int:
    try:
        import _posixshmem

        return _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    except ImportError:
        return os.open(os.path.join("/dev/shm", name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)


def unlink_name(name: str) -> None:
    """Remove ``/dev/shm/<name>`` if it exists (mappings stay valid until unmapped)."""
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


class SystemRegion:
    """One POSIX shared-memory region mapped into this process (created here, so owned here);
    ``key`` is what ``SystemSharedMemoryRegister`` takes."""

    def __init__(self, size: int) -> None:
        self.name = new_region_name()
        self.size = size
        fd = _shm_open(self.name)
        self.linked = True
        try:
            try:
                # reserve the pages now: a full /dev/shm then fails here with ENOSPC instead of
                # killing the process with SIGBUS at the first write
                os.posix_fallocate(fd, 0, size)
            except AttributeError:  # platforms without posix_fallocate
                os.ftruncate(fd, size)
            self.mmap: Any = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            self.unlink()
            raise
        os.close(fd)
        self.array: Any = np.frombuffer(self.mmap, dtype=np.uint8)

    @property
    def key(self) -> str:
        return "/" + self.name

    def view(self, offset: int, dtype: np.dtype, shape: Sequence[int]) -> np.ndarray:
        """A writable numpy view of ``shape``/``dtype`` at byte ``offset`` (no copy)."""
        count = math.prod(shape)
        return self.array[offset: offset + count * dtype.itemsize].view(dtype).reshape(shape)

    def unlink(self) -> None:
        if self.linked:
            self.linked = False
            unlink_name(self.name)

    def close(self) -> None:
        self.unlink()
        self.array = None
        try:
            self.mmap.close()
        except BufferError:  # a caller still holds a view: the mapping goes with the last view
            logger.debug("region %s still has views; unmapped when they are gone", self.name)

    def __repr__(self) -> str:
        return f"SystemRegion({self.name!r}, {self.size})"


# -- leaked registrations of dead clients ------------------------------------------------------------

def stale_names(names: Sequence[str]) -> list[str]:
    """Those of ``names`` made by a process of this pid namespace that no longer exists."""
    return [name for name in names if (pid := pid_of(name)) is not None and not pid_alive(pid)]


def _dev_shm_names() -> list[str]:
    try:
        return [name for name in os.listdir("/dev/shm") if name.startswith(PREFIX + "-")]
    except OSError:
        return []


def sweep_stale_regions(grpc: Any, *, kinds: Sequence[str] = ("System",),
                        timeout_s: float = 5.0) -> list[str]:
    """Unlink (in ``/dev/shm``) and unregister (at the server) regions of clients that died.

    ``grpc``: a :class:`~coffea_sonic.transport.grpc.GrpcTransport` (or ``ServerSettings`` or
    ``host:port``) of the server. ``kinds``: ``"System"`` and/or ``"Cuda"`` registrations to look
    at. Returns the names removed.

    >>> sweep_stale_regions("127.0.0.1:1", timeout_s=0.5)  # nothing stale, no server: nothing
    []
    """
    from ..grpc.transport import GrpcTransport

    removed = []
    for name in stale_names(_dev_shm_names()):
        unlink_name(name)
        removed.append(name)
    if isinstance(grpc, str):
        grpc = ServerSettings(grpc)
    grpc = GrpcTransport(grpc) if isinstance(grpc, ServerSettings) else grpc
    for kind in kinds:
        try:
            status = grpc.call(f"{kind}SharedMemoryStatus", timeout_s)
        except TransportError as error:  # nothing to sweep on a server we cannot ask
            logger.debug("cannot list %s shared-memory regions at %s: %s", kind, grpc.address, error)
            continue
        for name in stale_names(list(status.regions)):
            try:
                grpc.call(f"{kind}SharedMemoryUnregister", timeout_s, name=name)
            except TransportError as error:
                logger.debug("cannot unregister stale %s at %s: %s", name, grpc.address, error)
                continue
            removed.append(name)
            logger.info("unregistered region %s of dead client %d at %s", name, pid_of(name),
                        grpc.address)
    return removed
