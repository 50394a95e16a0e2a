"""The cache directory's size limit, oldest entries first (how: docs/internals/caches.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path

from .store import ENTRY_SUFFIX, TEMP_PREFIX

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["SizeLimit", "scan", "touch"]

logger = logging.getLogger(__name__)

#: eviction leaves the directory this full, so the next writes do not evict again at once
LOW_WATER = 0.9
#: how often another process' writes are looked for (a scan of the directory)
RESCAN_S = 30.0
#: a temporary file this old belongs to a writer that died
STALE_TEMP_S = 3600.0
#: a hit refreshes its entry's time at most this often
TOUCH_S = 60.0


def scan(root: Path) -> tuple[list[tuple[float, int, Path]], list[Path]]:
    """Every entry under ``root`` as (mtime, size, path), and the stale temporary files."""
    entries: list[tuple[float, int, Path]] = []
    stale: list[Path] = []
    cutoff = time.time() - STALE_TEMP_S
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            try:
                status = path.stat()
            except OSError:
                continue  # removed meanwhile
            if name.endswith(ENTRY_SUFFIX) and not name.startswith(TEMP_PREFIX):
                entries.append((status.st_mtime, status.st_size, path))
            elif name.startswith(TEMP_PREFIX) and status.st_mtime < cutoff:
                stale.append(path)
    return entries, stale


class SizeLimit:
    """Keeps the entries under ``root`` within ``max_bytes`` (per process)."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._known_bytes: int | None = None
        self._scanned_at = 0.0
        self._written = 0

    def wrote(self, size: int) -> None:
        """Count ``size`` bytes written by this process; evict if the directory may be full."""
        with self._lock:
            self._written += size
            known = self._known_bytes
            since = time.monotonic() - self._scanned_at
            due = known is None or since > RESCAN_S
            # over the limit: scan again, but not on every write while another process evicts
            full = known is not None and known + self._written > self.max_bytes and since > 1.0
        if due or full:
            self.evict()

    def evict(self) -> int:
        """Scan, and delete the oldest entries if over the limit; returns entries deleted."""
        entries, stale = scan(self.root)
        total = sum(size for _, size, _ in entries)
        deleted = 0
        if total > self.max_bytes or stale:
            with self._exclusive() as mine:
                if mine:
                    deleted, total = self._delete_oldest(entries, stale, total)
        with self._lock:
            self._known_bytes, self._written = total, 0
            self._scanned_at = time.monotonic()
        return deleted

    def _delete_oldest(self, entries: list[tuple[float, int, Path]], stale: list[Path],
                       total: int) -> tuple[int, int]:
        for path in stale:
            with contextlib.suppress(OSError):
                path.unlink()
        deleted = 0
        if total > self.max_bytes:
            goal = LOW_WATER * self.max_bytes
            for _, size, path in sorted(entries, key=lambda entry: entry[0]):
                if total <= goal:
                    break
                with contextlib.suppress(OSError):
                    path.unlink()
                    deleted += 1
                total -= size
            logger.info("coffea-sonic cache: evicted %d entries from %s (now %.1f MB of %.1f MB)",
                        deleted, self.root, total / 1e6, self.max_bytes / 1e6)
        return deleted, total

    @contextlib.contextmanager
    def _exclusive(self):
        """Yields True while this process holds the eviction lock, False if another does."""
        if fcntl is None:
            yield True
            return
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".evict.lock", "a+b") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def touch(path: Path) -> None:
    """Mark a hit entry as recently used (if not done within ``TOUCH_S``)."""
    now = time.time()
    with contextlib.suppress(OSError):
        if now - path.stat().st_mtime > TOUCH_S:
            os.utime(path, (now, now))
