"""A scenario's report on disk: the JSON (every raw number) beside its Markdown table.

>>> import tempfile
>>> out = Path(tempfile.mkdtemp()) / "run"
>>> write_report({"rows": 3}, out, "sweep", lambda report: f"| rows | {report['rows']} |\\n")
'| rows | 3 |\\n'
>>> sorted(p.name for p in out.iterdir())
['sweep.json', 'sweep.md']
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

__all__ = ["write_report"]


def write_report(report: dict, out: str | Path, stem: str, table: Callable[[dict], str]) -> str:
    """``stem``.json (``report``) and ``stem``.md (``table(report)``) in ``out`` (created when
    missing); returns the table."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1, default=str))
    text = table(report)
    (out / f"{stem}.md").write_text(text)
    return text
