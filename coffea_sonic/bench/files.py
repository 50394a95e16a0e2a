"""A scenario's report on disk: the JSON (every raw number) beside its Markdown tables, and its
figures (matplotlib on the file-only Agg backend), written the same way by every scenario.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

__all__ = ["cell", "pyplot", "save_figure", "section", "table", "write_json", "write_report"]


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]], align: str = "") -> list[str]:
    """A Markdown table's lines: ``header``, the rule (one letter of ``align`` a column: ``r``
    right-aligns it, anything else or a missing letter leaves it left) and a line a row.

    >>> table(["model", "rows/s"], [["m", 3], ["n", "1 | 2"]], "lr")
    ['| model | rows/s |', '|---|---:|', '| m | 3 |', '| n | 1 | 2 |']
    """
    rule = "|" + "".join("---:|" if align[i:i + 1] == "r" else "---|" for i in range(len(header)))
    return [_line(header), rule, *(_line(row) for row in rows)]


def cell(value: Any, spec: str = "", suffix: str = "") -> str:
    """A table cell: ``value`` formatted by ``spec`` with ``suffix``, or ``–`` where it is None.

    >>> cell(None, ".2f"), cell(0.123, ".2f"), cell(25.0, ".0f", " %")
    ('–', '0.12', '25 %')
    """
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _line(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def section(title: str, header: Sequence[Any], rows: Iterable[Sequence[Any]], align: str = "",
            intro: Sequence[str] = ()) -> list[str]:
    """A blank line, ``## title``, a blank line, the ``intro`` lines and the :func:`table`; no
    lines at all where there are no rows.

    >>> section("Sweep", ["a"], [])
    []
    >>> section("Sweep", ["a"], [[1]], intro=["one row", ""])
    ['', '## Sweep', '', 'one row', '', '| a |', '|---|', '| 1 |']
    """
    rows = list(rows)
    return ["", f"## {title}", "", *intro, *table(header, rows, align)] if rows else []


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
