"""What happened to inference, on record: :class:`Incident`, :class:`IncidentLog` and the journal.

How records are coalesced and reach the user, with examples: docs/internals/incidents.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

__all__ = ["KINDS", "Incident", "IncidentLog", "chunk_context", "current_chunk", "flush", "read_journal",
           "record", "set_journal", "take"]

logger = logging.getLogger(__name__)

#: every kind of incident, and how a report words it
KINDS: dict[str, str] = {
    "quarantined": "server quarantined (unreachable, reset or too slow)",
    "readmitted": "server answered again and was re-admitted",
    "retried": "requests retried after a transient failure",
    "failover": "requests moved to another server",
    "fallback": "rows answered by the in-process fallback",
    "waited": "calls waited for a server to come back (no fallback set)",
    "gave_up": "calls failed: no server could serve them",
    "failed_attempt": "chunk attempts that failed (coffea retries or fails them)",
}

#: longest detail kept per record (an error message's first part)
DETAIL_CHARS = 300


@dataclass(frozen=True)
class Incident:
    """One thing that happened to inference, ``count`` times between ``first`` and ``last``
    (wall-clock seconds), in process ``pid`` on ``host``."""

    kind: str
    server: str = ""
    model: str = ""
    chunk: str = ""
    rows: int = 0
    count: int = 1
    first: float = 0.0
    last: float = 0.0
    detail: str = ""
    host: str = ""
    pid: int = 0
    id: str = ""

    def describe(self) -> str:
        """One line: when, what, where, how much."""
        when = time.strftime("%H:%M:%S", time.localtime(self.first))
        if self.last - self.first >= 1:
            when += time.strftime("-%H:%M:%S", time.localtime(self.last))
        parts = [f"{when} {self.kind}"]
        if self.count > 1:
            parts.append(f"x{self.count}")
        for label, value in (("server", self.server), ("model", self.model),
                             ("chunk", self.chunk)):
            if value:
                parts.append(f"{label} {value}")
        if self.rows:
            parts.append(f"{self.rows} rows")
        if self.detail:
            parts.append(f"({self.detail})")
        return " ".join(parts)


class IncidentLog:
    """Incidents by id, summed like an accumulator (``+``, ``+=``; coffea adds them over chunks).

    >>> a = IncidentLog([Incident("fallback", model="m", rows=10, id="1")])
    >>> b = IncidentLog([Incident("fallback", model="m", rows=10, count=2, last=5.0, id="1")])
    >>> (a + b).totals()  # one id counted once, its latest copy kept
    {'fallback': {'count': 2, 'rows': 10}}
    """

    def __init__(self, incidents: Iterable[Incident] = ()) -> None:
        self._by_id: dict[str, Incident] = {}
        for incident in incidents:
            self._keep(incident)

    def _keep(self, incident: Incident) -> None:
        held = self._by_id.get(incident.id)
        if held is None or (incident.last, incident.count) >= (held.last, held.count):
            self._by_id[incident.id] = incident

    def __iter__(self) -> Iterator[Incident]:
        return iter(sorted(self._by_id.values(), key=lambda i: (i.first, i.kind, i.id)))

    def __len__(self) -> int:
        return len(self._by_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IncidentLog) and self._by_id == other._by_id

    def __add__(self, other: Any) -> "IncidentLog":
        if not isinstance(other, IncidentLog):
            return NotImplemented
        total = IncidentLog(self._by_id.values())
        total += other
        return total

    def __iadd__(self, other: Any) -> "IncidentLog":
        if not isinstance(other, IncidentLog):
            return NotImplemented
        for incident in other._by_id.values():
            self._keep(incident)
        return self

    def __repr__(self) -> str:
        return f"IncidentLog({len(self)} incidents: {self.totals()})"

    def totals(self) -> dict[str, dict[str, int]]:
        """``{kind: {"count": occurrences, "rows": rows}}``, kinds in :data:`KINDS` order."""
        totals: dict[str, dict[str, int]] = {}
        for kind in KINDS:
            of_kind = [i for i in self._by_id.values() if i.kind == kind]
            if of_kind:
                totals[kind] = {"count": sum(i.count for i in of_kind),
                                "rows": sum(i.rows for i in of_kind)}
        return totals

    def chunks(self, *kinds: str) -> list[str]:
        """The chunks with incidents (of ``kinds``, if given), sorted."""
        return sorted({i.chunk for i in self._by_id.values()
                       if i.chunk and (not kinds or i.kind in kinds)})

    def to_records(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(incident) for incident in self]

    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]]) -> "IncidentLog":
        names = {f.name for f in dataclasses.fields(Incident)}
        return cls(Incident(**{k: v for k, v in r.items() if k in names}) for r in records)


# -- this process' journal --------------------------------------------------------------------------

#: the chunk being processed in this thread (its label), set by the processor mixin
_chunk: contextvars.ContextVar[str] = contextvars.ContextVar("coffea_sonic_incident_chunk",
                                                             default="")


class _Journal:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        #: (kind, server, model, chunk) -> the record being coalesced, until taken
        self.pending: dict[tuple[str, str, str, str], Incident] = {}
        self.folder: Path | None = None
        self.host = socket.gethostname()


_journal = _Journal()


def _here() -> _Journal:
    global _journal
    if _journal.pid != os.getpid():  # a forked child keeps none of its parent's records
        _journal = _Journal()
    return _journal


@contextlib.contextmanager
def chunk_context(label: str) -> Iterator[None]:
    """Incidents recorded inside (by this thread) name chunk ``label``."""
    token = _chunk.set(label)
    try:
        yield
    finally:
        _chunk.reset(token)


def current_chunk() -> str:
    """The label of the chunk this thread is processing ("" outside one)."""
    return _chunk.get()


def set_journal(folder: str | os.PathLike[str] | None) -> None:
    """Also append this process' records to ``folder/<host>-<pid>.jsonl`` (None: stop)."""
    _here().folder = Path(folder) if folder else None


def record(kind: str, *, server: str = "", model: str = "", chunk: str | None = None,
           rows: int = 0, detail: str = "") -> None:
    """Count one ``kind`` incident (coalesced with pending ones of its server, model, chunk)."""
    if kind not in KINDS:
        raise ValueError(f"unknown incident kind {kind!r}; known: {sorted(KINDS)}")
    journal = _here()
    chunk = current_chunk() if chunk is None else chunk
    now = time.time()
    detail = detail[:DETAIL_CHARS]
    key = (kind, server, model, chunk)
    with journal.lock:
        held = journal.pending.get(key)
        if held is None:
            incident = Incident(kind, server, model, chunk, rows, 1, now, now, detail,
                                journal.host, journal.pid, secrets.token_hex(8))
        else:
            incident = dataclasses.replace(held, rows=held.rows + rows, count=held.count + 1,
                                           last=now, detail=detail or held.detail)
        journal.pending[key] = incident
    if journal.folder is not None and kind in ("quarantined", "readmitted", "failed_attempt"):
        flush()  # the rare, telling ones reach the file at once


def take() -> IncidentLog:
    """The pending records (written to the journal file too), no longer pending."""
    journal = _here()
    with journal.lock:
        taken = list(journal.pending.values())
        journal.pending.clear()
    _append(journal, taken)
    return IncidentLog(taken)


def flush() -> None:
    """Write the pending records to the journal file (they stay pending)."""
    journal = _here()
    with journal.lock:
        pending = list(journal.pending.values())
    _append(journal, pending)


def _append(journal: _Journal, incidents: list[Incident]) -> None:
    if journal.folder is None or not incidents:
        return
    try:
        journal.folder.mkdir(parents=True, exist_ok=True)
        path = journal.folder / f"{journal.host}-{journal.pid}.jsonl"
        with open(path, "a", encoding="utf-8") as stream:
            for incident in incidents:
                stream.write(json.dumps(dataclasses.asdict(incident)) + "\n")
    except OSError as error:  # a worker that cannot write there still delivers through outputs
        logger.debug("coffea-sonic: incident journal %s not writable: %s", journal.folder, error)


def read_journal(folder: str | os.PathLike[str]) -> IncidentLog:
    """Every record the processes wrote to ``folder`` (empty if there is none)."""
    records = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a killed worker
                continue
    return IncidentLog.from_records(records)
