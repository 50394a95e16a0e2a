"""Per-process hits, misses and bytes saved of a cache directory (docs/internals/caches.md)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path

from ..core.process_local import ProcessLocal
from ..stats import Counters

__all__ = ["CacheCounters", "process_counters", "read_counters"]

STATS_DIR = ".stats"
FLUSH_S = 1.0


@dataclass
class CacheCounters(Counters):
    """Counts of one cache directory: blocks found and not found, rows, bytes not sent."""

    #: blocks answered from the directory, and blocks that had to be computed
    hits: int = 0
    misses: int = 0
    hit_rows: int = 0
    miss_rows: int = 0
    #: request bytes (inputs) that did not have to be sent because of hits
    bytes_saved: int = 0
    #: entries found corrupt (removed and recomputed)
    corrupt: int = 0
    #: entries written, and their bytes
    stored: int = 0
    stored_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        """Share of rows answered from the cache (0 before any lookup)."""
        rows = self.hit_rows + self.miss_rows
        return self.hit_rows / rows if rows else 0.0

    def to_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "hit_rate": self.hit_rate}


class _ProcessCounters(CacheCounters):
    """The counters of one directory in this process, flushed to its stats file."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self._root = root
        self._lock = threading.Lock()
        self._flushed_at = 0.0

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)
        if time.monotonic() - self._flushed_at > FLUSH_S:
            self.flush()

    def snapshot(self) -> CacheCounters:
        with self._lock:
            return self.copy()

    def flush(self) -> None:
        """Write this process' counters to the directory (errors only logged: stats are extra)."""
        self._flushed_at = time.monotonic()
        folder = self._root / STATS_DIR
        name = f"{socket.gethostname()}-{os.getpid()}.json"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            temp = folder / f".{name}.{threading.get_ident()}.tmp"
            temp.write_text(json.dumps(dataclasses.asdict(self.snapshot())))
            os.replace(temp, folder / name)
        except OSError:
            pass


_registry: ProcessLocal[str, _ProcessCounters] = ProcessLocal("inference cache counters")


def process_counters(root: Path) -> _ProcessCounters:
    """This process' counters of the directory ``root`` (one object per directory and process)."""
    return _registry.get(str(root), lambda: _ProcessCounters(root))


def read_counters(root: str | os.PathLike[str]) -> tuple[CacheCounters, int]:
    """The counters of every process that used ``root``, summed, and how many processes."""
    total = CacheCounters()
    processes = 0
    known = {f.name for f in fields(CacheCounters)}
    for path in sorted((Path(root) / STATS_DIR).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        total = total + CacheCounters(**{k: v for k, v in data.items() if k in known})
        processes += 1
    return total, processes
