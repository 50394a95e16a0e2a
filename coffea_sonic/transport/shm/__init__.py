"""Shared-memory transports to a Triton server on this host: tensors never cross the socket.

* :mod:`.regions`: region names (``csonic-shm-<pidns>-<pid>-...``), POSIX regions, host
  detection, the sweep of dead clients' regions;
* :mod:`.pool`: the one slot pool of both transports (grown on demand, never blocking, fork-safe,
  unregistered at exit);
* :mod:`.system`: :class:`SystemShmTransport` (numpy tensors through ``/dev/shm``);
* :mod:`.cuda`: :class:`CudaShmTransport` (torch CUDA tensors through CUDA IPC memory);
* :mod:`.common`: what both transports share (slot layout, request flow, failures);
* :mod:`.select`: :func:`probe_shared_memory` (is it the same server process that maps our
  regions and serves our requests?) and :func:`shm_possible` (is the server on this host?).

One transport per process and server: ``coffea_sonic.transport.registry.open_transport``.

>>> from coffea_sonic.core.endpoint import ServerSettings
>>> with SystemShmTransport(ServerSettings("127.0.0.1:1")) as transport:
...     transport.name, transport.regions()
('shm', [])
"""

from .cuda import CudaShmTransport
from .pool import SlotPool
from .regions import is_local_host, region_prefix, sweep_stale_regions
from .select import forget_probes, probe_shared_memory, shm_possible
from .system import SystemShmTransport

__all__ = [
    "CudaShmTransport", "SlotPool", "SystemShmTransport", "forget_probes", "is_local_host",
    "probe_shared_memory", "region_prefix", "shm_possible", "sweep_stale_regions",
]
