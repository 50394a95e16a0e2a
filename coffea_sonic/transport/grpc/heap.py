"""glibc's malloc thresholds for large messages (why: docs/internals/transport.md)."""

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
    """Set the thresholds (docs/internals/transport.md) once; whether they are in effect."""
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
