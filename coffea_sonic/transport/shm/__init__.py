"""Shared memory to a Triton server on this host (how: docs/internals/transport-shm.md)."""

from .cuda import CudaShmTransport
from .pool import SlotPool
from .regions import is_local_host, region_prefix, sweep_stale_regions
from .select import forget_probes, probe_shared_memory, shm_possible
from .system import SystemShmTransport

__all__ = [
    "CudaShmTransport", "SlotPool", "SystemShmTransport", "forget_probes", "is_local_host",
    "probe_shared_memory", "region_prefix", "shm_possible", "sweep_stale_regions",
]
