"""Keep glibc from handing multi-megabyte message buffers back to the kernel after every request.

Every request over gRPC or HTTP allocates its message (several MiB) and the transport library's
copies of it, and frees them when answered. glibc serves allocations above its mmap threshold
(128 KiB at first, raised on the fly up to the size of the last freed block) with fresh ``mmap``
pages and trims the heap's top once more than twice that is free, so each request pays a page
fault per 4 KiB it writes. On the 2-core box that was most of the client's CPU: a default
TritonModel calling the transport-bound ``passthrough`` model (200 000 rows, 12.8 MB per call)
over gRPC took 10-11 ms of client CPU per call with 390 000-430 000 minor faults in 5 s;
with the thresholds below 6.2-6.4 ms and 31 000 faults.

:func:`tune_heap` raises the mmap threshold to 32 MiB (glibc's maximum) and the trim threshold
to 256 MiB, once per process, on glibc only, and not where the user tuned malloc already
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``) or opted out with
``COFFEA_SONIC_MALLOC_TUNING=0``. The price: up to 256 MiB of freed memory stays with the
process for reuse instead of going back to the system.

>>> tune_heap() in (True, False)
True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_heap"]

logger = logging.getLogger(__name__)

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: blocks up to this size come from the heap (glibc refuses more: HEAP_MAX_SIZE / 2)
MMAP_THRESHOLD = 32 << 20
#: free memory at the heap's top kept for reuse
TRIM_THRESHOLD = 256 << 20
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_tuned: bool | None = None


def tune_heap() -> bool:
    """Set the thresholds (see the module docstring) once; whether they are in effect."""
    global _tuned
    if _tuned is not None:
        return _tuned
    _tuned = False
    if os.environ.get("COFFEA_SONIC_MALLOC_TUNING", "1") == "0" or any(
            name in os.environ for name in _USER_SETTINGS):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        done = (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
    except (OSError, AttributeError):
        return False
    logger.debug("malloc thresholds for large messages %s", "set" if done else "refused")
    _tuned = done
    return done
