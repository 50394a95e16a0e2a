"""One pool of registered shared-memory slots (how: docs/internals/transport-shm.md)."""

from __future__ import annotations

import atexit
import errno
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from ...core.process_local import ProcessLocal
from ..errors import TransportError
from .regions import SystemRegion, region_size, sweep_stale_regions

__all__ = ["CLEANUP_TIMEOUT_S", "DEFAULT_MAX_SLOTS", "RegionKind", "Slot", "SlotPool",
           "SystemRegions", "close_all_pools"]

logger = logging.getLogger(__name__)

#: Default number of slots (regions, so requests in flight through shared memory) per pool.
DEFAULT_MAX_SLOTS = 8
#: Seconds a clean-up call to the server may take (at exit a dead server must not hang us).
CLEANUP_TIMEOUT_S = 2.0
#: Unregistering a region the server still uses is retried this often, backing off up to
#: RETRY_MAX_DELAY_S between tries (about 5 minutes in all).
RETRY_ATTEMPTS = 40
RETRY_MAX_DELAY_S = 10.0
#: Errors of region creation that mean "no shared memory here" (send inline from now on).
_NO_ROOM = (errno.ENOSPC, errno.ENOMEM, errno.EACCES, errno.EPERM, errno.ENOSYS, errno.ENOENT)


class RegionKind:
    """How one kind of region is made, registered and freed (system memory here).

    ``rpc``: the prefix of Triton's RPCs for this kind (``System`` -> ``SystemSharedMemory*``).
    """

    rpc = "System"
    label = "system shared memory"

    def make(self, size: int) -> Any:
        """A new region of ``size`` bytes with ``.name``, ``.size``, ``.view()`` and ``.close()``."""
        raise NotImplementedError

    def register_request(self, region: Any) -> Any:
        """The ``<rpc>SharedMemoryRegisterRequest`` of ``region``."""
        raise NotImplementedError

    def registered(self, region: Any) -> None:
        """Called once the server has mapped ``region``."""

    def free(self, region: Any) -> None:
        region.close()


class SystemRegions(RegionKind):
    """POSIX regions, registered by key; the name is unlinked as soon as the server mapped it."""

    def make(self, size: int) -> SystemRegion:
        return SystemRegion(size)

    def register_request(self, region: SystemRegion) -> Any:
        from tritonclient.grpc import service_pb2

        return service_pb2.SystemSharedMemoryRegisterRequest(
            name=region.name, key=region.key, offset=0, byte_size=region.size)

    def registered(self, region: SystemRegion) -> None:
        # the server has mapped it: without the name nothing can leak, even after a SIGKILL
        region.unlink()


@dataclass(eq=False)
class Slot:
    """One region registered with the pool's server (``generation``: see :meth:`SlotPool.retire`)."""

    region: Any
    generation: int

    @property
    def name(self) -> str:
        return self.region.name

    @property
    def size(self) -> int:
        return self.region.size


class SlotPool:
    """Registered slots of one :class:`RegionKind` at the server of ``grpc`` (a GrpcTransport)."""

    def __init__(self, grpc: Any, kind: RegionKind, max_slots: int = DEFAULT_MAX_SLOTS) -> None:
        if not isinstance(max_slots, int) or max_slots < 1:
            from ...errors import ConfigurationError

            raise ConfigurationError(f"max_slots must be an int >= 1, not {max_slots!r}")
        self.grpc, self.kind, self.max_slots = grpc, kind, max_slots
        #: its lock is this process' own (a forked child gets a fresh one)
        self._local: ProcessLocal[str, Any] = ProcessLocal("shared-memory slot pool")
        self._pid = os.getpid()
        self._free: list[Slot] = []
        self._busy: set[Slot] = set()
        self._making = 0
        self._generation = 0
        self._closed = False
        self._swept = False
        self._inherited: list[Slot] = []
        self._pending: set[Slot] = set()  # dropped, the server still using them
        #: why this pool sends everything inline (None: it does not)
        self.disabled: str | None = None
        self.stats = {"regions_made": 0, "regions_dropped": 0, "all_busy": 0, "retired": 0}
        _pools.set(id(self), self)

    @property
    def _lock(self) -> threading.Lock:
        return self._local.lock

    def __repr__(self) -> str:
        return (f"SlotPool({self.kind.rpc}, {self.grpc.address!r}, "
                f"{len(self._free) + len(self._busy)}/{self.max_slots} slots)")

    # -- fork safety -----------------------------------------------------------------------------
    def _after_fork(self) -> None:
        """In a forked child (lock held): forget the parent's slots without touching them."""
        self._inherited.extend([*self._free, *self._busy, *self._pending])
        self._free, self._busy, self._pending, self._making = [], set(), set(), 0
        self._pid = os.getpid()
        self._swept = False

    @property
    def owned(self) -> bool:
        return self._pid == os.getpid()

    # -- slots -----------------------------------------------------------------------------------
    def acquire(self, nbytes: int, timeout_s: float) -> Slot | None:
        """A registered slot of at least ``nbytes`` (reused, made or grown), or None when all
        ``max_slots`` are busy or shared memory is unusable here (``disabled``).

        Raises :class:`TransportError` when the server refuses the registration (``restricted``,
        ``shm_region`` when it cannot map our memory, ``down``...).
        """
        victim = None
        with self._lock:
            if not self.owned:
                self._after_fork()
            if self._closed:
                raise TransportError("internal", f"{self.kind.label} pool is closed",
                                     address=self.grpc.address)
            if self.disabled is not None:
                return None
            fitting = [slot for slot in self._free if slot.size >= nbytes]
            if fitting:
                slot = min(fitting, key=lambda s: s.size)
                self._free.remove(slot)
                self._busy.add(slot)
                return slot
            if len(self._free) + len(self._busy) + self._making < self.max_slots:
                self._making += 1
            elif self._free:  # full, every free slot too small: replace the smallest
                victim = min(self._free, key=lambda s: s.size)
                self._free.remove(victim)
                self._making += 1
            else:
                self.stats["all_busy"] += 1
                return None
        if victim is not None:
            self._discard(victim)
        try:
            return self._make(nbytes, timeout_s)
        finally:
            with self._lock:
                self._making -= 1

    def _make(self, nbytes: int, timeout_s: float) -> Slot | None:
        try:
            region = self.kind.make(region_size(nbytes))
        except OSError as error:
            if error.errno not in _NO_ROOM:
                raise
            self._disable(error)
            return None
        try:
            if not self._swept:
                self._swept = True
                sweep_stale_regions(self.grpc, kinds=(self.kind.rpc,), timeout_s=timeout_s)
            self.grpc.rpc(f"{self.kind.rpc}SharedMemoryRegister",
                          self.kind.register_request(region), timeout_s)
        except BaseException:
            self.kind.free(region)
            raise
        self.kind.registered(region)
        with self._lock:
            slot = Slot(region, self._generation)
            self._busy.add(slot)
            self.stats["regions_made"] += 1
            closed = self._closed
        logger.debug("registered %s %s (%d bytes) at %s", self.kind.label, region.name,
                     region.size, self.grpc.address)
        if closed:
            self.drop(slot)
            raise TransportError("internal", f"{self.kind.label} pool is closed",
                                 address=self.grpc.address)
        return slot

    def _disable(self, error: OSError) -> None:
        # a full /dev/shm or a host without POSIX shared memory will not change its mind soon
        if self.disabled is None:
            self.disabled = f"{type(error).__name__}: {error}"
            logger.warning("%s unavailable for %s (%s); sending tensors in the gRPC message "
                           "instead. Make /dev/shm larger to use shared memory.",
                           self.kind.label, self.grpc.address, error)

    def release(self, slot: Slot) -> None:
        """Give back the slot of a request the server has answered (reused later)."""
        with self._lock:
            if slot not in self._busy:
                return  # dropped already, or a parent's slot in a forked child
            self._busy.discard(slot)
            keep = not self._closed and slot.generation == self._generation
            if keep:
                self._free.append(slot)
        if not keep:
            self._discard(slot)

    def drop(self, slot: Slot) -> None:
        """Unregister and free ``slot`` (a failed or cancelled request): never used again."""
        with self._lock:
            if slot not in self._busy:
                return
            self._busy.discard(slot)
            self.stats["regions_dropped"] += 1
        self._discard(slot)

    def retire(self, generation: int | None = None) -> bool:
        """Drop every slot (free ones now, busy ones when released); with the ``generation`` of
        the slot the server did not know, only if not retired already. Whether it retired any."""
        with self._lock:
            if generation is not None and generation != self._generation:
                return False
            self._generation += 1
            free, self._free = self._free, []
            self.stats["retired"] += len(free) + len(self._busy)
        for slot in free:
            self._discard(slot)
        return True

    def _discard(self, slot: Slot, timeout_s: float = CLEANUP_TIMEOUT_S, attempt: int = 0) -> bool:
        """Unregister and free (only in the process that made it; one still in use: later);
        False if the server is gone."""
        if not self.owned:
            self._inherited.append(slot)
            return True
        reachable = True
        if timeout_s > 0:
            try:
                self.grpc.call(f"{self.kind.rpc}SharedMemoryUnregister", timeout_s, name=slot.name)
            except TransportError as error:  # a dead server has forgotten it anyway
                if "in use" in error.detail.lower() and attempt < RETRY_ATTEMPTS:
                    self._retry_later(slot, attempt + 1)
                    return True
                reachable = error.kind not in ("down", "timeout")
                log = logger.warning if "in use" in error.detail.lower() else logger.debug
                log("could not unregister %s at %s: %s", slot.name, self.grpc.address, error)
        with self._lock:
            self._pending.discard(slot)
        try:
            self.kind.free(slot.region)
        except Exception:  # noqa: BLE001 - freeing must not fail a request or an exit
            logger.debug("freeing %s failed", slot.name, exc_info=True)
        return reachable

    def _retry_later(self, slot: Slot, attempt: int) -> None:
        """Unregister ``slot`` again after a backoff, from a timer thread (kept until then)."""
        with self._lock:
            self._pending.add(slot)
        delay = min(RETRY_MAX_DELAY_S, 0.05 * 2 ** attempt)
        timer = threading.Timer(delay, self._retry, (slot, attempt))
        timer.daemon = True
        timer.start()

    def _retry(self, slot: Slot, attempt: int) -> None:
        with self._lock:
            if slot not in self._pending or not self.owned:
                return
        self._discard(slot, CLEANUP_TIMEOUT_S, attempt)

    def pending(self) -> list[str]:
        """Regions dropped but still in use by the server (unregistered when it is done)."""
        with self._lock:
            return sorted(slot.name for slot in self._pending) if self.owned else []

    def regions(self) -> list[str]:
        """Names of the regions this pool holds now (this process' only)."""
        with self._lock:
            if not self.owned:
                return []
            return sorted(slot.name for slot in (*self._free, *self._busy))

    def close(self) -> None:
        """Unregister and free every free slot; busy ones go when their request ends, pending
        ones when the server lets them go (a sweep removes them once this process is gone)."""
        with self._lock:
            if not self.owned:
                self._after_fork()
            self._closed = True
            free, self._free = self._free, []
        timeout_s = CLEANUP_TIMEOUT_S
        for slot in free:
            if not self._discard(slot, timeout_s):
                timeout_s = 0  # the server is gone: free the rest without asking it
        _pools.pop(id(self))


#: this process' pools, strongly referenced: a pool is closed (its registrations removed) even
#: if its transport is dropped; a forked child closes only its own
_pools: ProcessLocal[int, SlotPool] = ProcessLocal("shared-memory slot pools")


def close_all_pools() -> None:
    """Close every pool made by this process (runs at interpreter exit)."""
    for pool in _pools.values():
        try:
            pool.close()  # in a forked child this only forgets the parent's slots
        except Exception:  # noqa: BLE001 - best effort at exit
            logger.debug("closing %r failed", pool, exc_info=True)


atexit.register(close_all_pools)
