"""``coffea-sonic monitor --inference-cache DIR``: what a persistent inference cache saved, all
processes (docs/internals/facility.md, "What the clients wrote").
"""

from __future__ import annotations

import os
from typing import Any

from ..cache import InferenceCache, read_counters

__all__ = ["cache_lines", "cache_record"]


def cache_record(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Summed counters of every process that used ``root``, and its entries on disk now."""
    counters, processes = read_counters(root)
    entries, size = InferenceCache(root).usage()
    return {"directory": str(root), "processes": processes, "entries": entries,
            "bytes_on_disk": size, **counters.to_dict()}


def cache_lines(root: str | os.PathLike[str]) -> list[str]:
    """The inference cache's part of a monitor frame."""
    record = cache_record(root)
    return [
        f"inference cache {record['directory']}  ({record['processes']} processes, "
        f"{record['entries']} entries, {record['bytes_on_disk'] / 1e6:.1f} MB on disk)",
        f"  hits {record['hits']} blocks ({record['hit_rows']} rows), misses {record['misses']} "
        f"blocks ({record['miss_rows']} rows), hit rate {100 * record['hit_rate']:.1f} %, "
        f"{record['bytes_saved'] / 1e6:.1f} MB not sent"
        + (f", {record['corrupt']} corrupt entries recomputed" if record["corrupt"] else ""),
    ]
