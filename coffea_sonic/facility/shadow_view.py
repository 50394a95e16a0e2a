"""``coffea-sonic monitor --shadow DIR``: shadow validation's findings, summed over processes
(docs/internals/facility.md, "What the clients wrote").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["shadow_lines", "shadow_record"]


def shadow_record(root: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"directory", "processes", "models": {model: {server: {output: figures}}}}``."""
    models: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    files = sorted(Path(root).glob("*.json"))
    for path in files:
        try:
            written = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now: the next frame reads it
        for server, outputs in written.get("report", {}).items():
            for output, figures in outputs.items():
                total = models.setdefault(written.get("model", "?"), {}).setdefault(
                    server, {}).setdefault(output, {"rows": 0, "largest": 0.0, "alarms": 0})
                total["rows"] += figures["rows"]
                total["alarms"] += figures["alarms"]
                total["largest"] = max(total["largest"], figures["largest"])
    return {"directory": str(root), "processes": len({p.name.rsplit("-", 1)[0] for p in files}),
            "models": models}


def shadow_lines(root: str | os.PathLike[str]) -> list[str]:
    """Shadow validation's part of a monitor frame."""
    record = shadow_record(root)
    lines = [f"shadow validation {record['directory']}  ({record['processes']} processes)"]
    for model, servers in sorted(record["models"].items()):
        for server, outputs in sorted(servers.items()):
            for output, figures in sorted(outputs.items()):
                lines.append(f"  {model} at {server} output {output}: {figures['rows']} rows "
                             f"compared, largest divergence {figures['largest']:.3g}, "
                             f"{figures['alarms']} alarm(s)")
    return lines
