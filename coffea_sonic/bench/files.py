"""A scenario's report on disk: the JSON (every raw number) beside its Markdown table, and its
figures (matplotlib on the file-only Agg backend), written the same way by every scenario.

>>> import tempfile
>>> out = Path(tempfile.mkdtemp()) / "run"
>>> write_report({"rows": 3}, out, "sweep", lambda report: f"| rows | {report['rows']} |\\n")
'| rows | 3 |\\n'
>>> sorted(p.name for p in out.iterdir())
['sweep.json', 'sweep.md']
>>> figure, axis = pyplot().subplots()
>>> save_figure(figure, out / "sweep.png", title="rows").name
'sweep.png'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

__all__ = ["pyplot", "save_figure", "write_json", "write_report"]


def write_report(report: dict, out: str | Path, stem: str, table: Callable[[dict], str]) -> str:
    """``stem``.json (``report``) and ``stem``.md (``table(report)``) in ``out`` (created when
    missing); returns the table."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1, default=str))
    text = table(report)
    (out / f"{stem}.md").write_text(text)
    return text


def write_json(data: Any, out: str | Path, name: str, also: str | None = None) -> list[Path]:
    """``data`` as JSON into ``out/name`` and, when given, the file ``also`` (folders created);
    prints each path.

    >>> import tempfile
    >>> [p.name for p in write_json({"ok": True}, tempfile.mkdtemp(), "x.json")]
      results: .../x.json
    ['x.json']
    """
    paths = [Path(out) / name, *([Path(also)] if also else [])]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, default=str) + "\n")
        print(f"  results: {path}")
    return paths


def pyplot() -> Any:
    """``matplotlib.pyplot`` drawing into files only (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure: Any, path: str | Path, title: str | None = None, dpi: int = 110) -> Path:
    """Write ``figure`` (with ``title`` above its panels) to ``path`` and free it."""
    if title:
        figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=dpi)
    pyplot().close(figure)
    return Path(path)
