"""Modes measured in alternating rounds, merged into one record per mode and client count.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["merge_rounds"]

#: server profile fields that add up over windows (the others are per request: averaged)
_COUNTS = ("requests", "executions")


def merge_rounds(windows: list[dict]) -> list[dict]:
    """One record per (mode, clients), in first-seen order: mean rates over the windows (each
    window equally long), median call p50, mean GPU busy and server profile, the worst
    ``labels_as_alone``, ``round_rates`` and,
    for a served mode, ``round_ratios`` against the direct window of the same round. A group with
    a failed window keeps that window's ``error``."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for window in windows:
        groups.setdefault((window["mode"], window["clients"]), []).append(window)
    direct_by_round = {(w["clients"], w["round"]): w["events_per_s"] for w in windows
                       if w["mode"] == "direct" and "error" not in w}
    records = []
    for (mode, clients), group in groups.items():
        record: dict[str, Any] = {"mode": mode, "clients": clients, "rounds": len(group)}
        failed = [w["error"] for w in group if "error" in w]
        if failed:
            record["error"] = failed[0]
            records.append(record)
            continue
        record["events_per_s"] = statistics.fmean(w["events_per_s"] for w in group)
        record["round_rates"] = [round(w["events_per_s"], 1) for w in group]
        if all("hits_per_s" in w for w in group):
            record["hits_per_s"] = statistics.fmean(w["hits_per_s"] for w in group)
        if all("chunk_ms_p50" in w for w in group):
            record["chunk_ms_p50"] = statistics.median(w["chunk_ms_p50"] for w in group)
        alike = [w["labels_as_alone"] for w in group if "labels_as_alone" in w]
        if alike:
            record["labels_as_alone"] = min(alike)
        busy = [w["gpu_percent"] for w in group if w.get("gpu_percent") is not None]
        record["gpu_percent"] = round(statistics.fmean(busy), 1) if busy else None
        profiles = [w["server_profile"] for w in group if w.get("server_profile")]
        if profiles:
            record["server_profile"] = _merged_profile(profiles)
        if mode != "direct":
            ratios = [w["events_per_s"] / direct_by_round[(clients, w["round"])] for w in group
                      if direct_by_round.get((clients, w["round"]))]
            if ratios:
                record["round_ratios"] = [round(ratio, 3) for ratio in ratios]
        records.append(record)
    return records


def _merged_profile(profiles: list[dict]) -> dict:
    merged = {}
    for key in profiles[0]:
        values = [profile[key] for profile in profiles if key in profile]
        merged[key] = (sum(values) if key in _COUNTS
                       else round(statistics.fmean(values), 3))
    return merged
