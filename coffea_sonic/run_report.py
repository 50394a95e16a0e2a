"""The run report: what happened to inference in a ``processor.Runner`` run, kept by the user.

How :class:`SonicStats` and :func:`finish_run` gather it, with an example:
docs/internals/incidents.md.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from . import config, incidents
from .incidents import IncidentLog
from .stats import InferenceStats

__all__ = ["SonicStats", "finish_run", "journal_folder", "run_folder", "summary_lines"]

logger = logging.getLogger(__name__)


class SonicStats(dict):
    """``{model: InferenceStats}`` of some chunks, and their incidents (``.incidents``).

    Adds up like coffea's accumulators (``+``, ``+=``), the incidents with each other.
    """

    def __init__(self, stats: Mapping[str, InferenceStats] | None = None,
                 incidents_log: IncidentLog | None = None) -> None:
        super().__init__(stats or {})
        self.incidents = incidents_log if incidents_log is not None else IncidentLog()

    def __add__(self, other: Any) -> "SonicStats":
        if not isinstance(other, SonicStats):
            return NotImplemented
        total = self.__deepcopy__({})
        total += other
        return total

    def __iadd__(self, other: Any) -> "SonicStats":
        if not isinstance(other, SonicStats):
            return NotImplemented
        for name, stats in other.items():
            self[name] = self[name] + stats if name in self else stats.copy()
        self.incidents += other.incidents
        return self

    def __reduce__(self) -> tuple:
        return SonicStats, (dict(self), self.incidents)

    def __deepcopy__(self, memo: dict) -> "SonicStats":
        return SonicStats({name: stats.copy() for name, stats in self.items()},
                          IncidentLog() + self.incidents)

    def __repr__(self) -> str:
        return f"SonicStats({dict.__repr__(self)}, incidents={self.incidents!r})"


def run_folder(run: str) -> Path:
    """Where run ``run``'s report and journal go: ``<report_dir>/<run>`` (the ``report_dir``
    setting, default ``<cache>/runs``)."""
    base = config.setting("report_dir", None)
    if not base:
        base = Path(str(config.setting("cache"))).expanduser() / "runs"
    return Path(str(base)).expanduser() / run


def journal_folder(run: str) -> str:
    """The journal folder of run ``run`` (absolute, as workers must find it)."""
    return str((run_folder(run) / "journal").resolve())


def _stats_in(output: Any, depth: int = 0) -> Iterator[SonicStats]:
    """Every :class:`SonicStats` in ``output`` (a value, or inside mappings two levels down)."""
    if isinstance(output, SonicStats):
        yield output
    elif isinstance(output, Mapping) and depth < 3:
        for value in output.values():
            yield from _stats_in(value, depth + 1)


def summary_lines(run: str, stats: SonicStats, path: str | None = None) -> list[str]:
    """The run's inference incidents in a few lines (the first names the run and report)."""
    log = stats.incidents
    where = f" (report: {path})" if path else ""
    saved = [f"  {model}: {value.repeat_calls} call(s) of {value.repeat_rows} rows answered by "
             "an identical call of the same chunk, no request sent"
             for model, value in sorted(stats.items()) if value.repeat_calls]
    if not log:
        return [f"coffea-sonic run {run}: no inference incidents{where}", *saved]
    lines = [f"coffea-sonic run {run}: inference incidents{where}", *saved]
    for server in sorted({i.server for i in log if i.kind == "quarantined"}):
        down = [i for i in log if i.server == server and i.kind == "quarantined"]
        back = [i for i in log if i.server == server and i.kind == "readmitted"]
        when = time.strftime("%H:%M:%S", time.localtime(min(i.first for i in down)))
        state = (f"re-admitted {time.strftime('%H:%M:%S', time.localtime(max(i.last for i in back)))}"
                 if back else "not seen again")
        lines.append(f"  server {server}: down from {when} ({down[0].detail[:120]}); {state}")
    for model in sorted({i.model for i in log if i.model}):
        of_model = IncidentLog(i for i in log if i.model == model)
        parts = []
        for kind, total in of_model.totals().items():
            if kind == "fallback":
                parts.append(f"{total['rows']} rows by fallback ({total['count']} time(s))")
            else:
                parts.append(f"{total['count']} {kind}")
        lines.append(f"  {model}: {', '.join(parts)} in {len(of_model.chunks())} chunk(s)")
    failed = [i for i in log if i.kind == "failed_attempt"]
    if failed:
        chunks = sorted({i.chunk for i in failed})
        lines.append(f"  {sum(i.count for i in failed)} chunk attempt(s) failed "
                     f"({', '.join(chunks[:3])}{', ...' if len(chunks) > 3 else ''}): "
                     f"{failed[-1].detail[:160]}")
    return lines


def finish_run(run: str, output: Any) -> Path | None:
    """Gather the run's incidents into ``output``'s stats, write the report, log the summary.

    Returns the report's path (None where it could not be written; the output and the log
    still hold everything).
    """
    found = list(_stats_in(output))
    merged = sum(found, SonicStats())  # every model's totals and every incident
    merged.incidents += incidents.take()  # what this (driver) process still holds
    folder = run_folder(run)
    journal = folder / "journal"
    if journal.is_dir():
        merged.incidents += incidents.read_journal(journal)
    for stats in found:  # every stats object of the output shows the whole run's record
        stats.incidents = IncidentLog() + merged.incidents
    path: Path | None = folder / "report.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "run": run, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "totals": {name: vars(value) for name, value in merged.items()},
            "incident_totals": merged.incidents.totals(),
            "incidents": merged.incidents.to_records()}, indent=1, default=str))
        shutil.rmtree(journal, ignore_errors=True)
    except OSError as error:
        logger.warning("coffea-sonic: run report not written to %s: %s", folder, error)
        path = None
    lines = summary_lines(run, merged, str(path) if path else None)
    (logger.warning if merged.incidents else logger.info)("\n".join(lines))
    return path
