"""Which model answered: per server, model, version and config digest, how many rows.

How it is recorded and summed, with examples: docs/internals/shadow.md.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from .dispatch import CallHooks, PieceAnswer
from .errors import InferenceError

__all__ = ["FALLBACK_SOURCE", "InconsistentVersionsError", "Provenance", "ProvenanceHook"]

logger = logging.getLogger(__name__)

#: The source of rows the in-process fallback computed.
FALLBACK_SOURCE = "fallback engine"
Key = tuple[str, str, str, str]  # model, source, version, config digest
_warned: set[tuple[str, tuple[str, ...]]] = set()
_warned_lock = threading.Lock()


class InconsistentVersionsError(InferenceError):
    """Answers of one model came from more than one version (``require_consistent_versions``)."""


@dataclass
class Provenance:
    """Rows answered per (model, source, version, config digest); adds up over chunks."""

    answered: dict[Key, int] = field(default_factory=dict)
    require_consistent_versions: bool = False

    @classmethod
    def of(cls, model: str, source: str, version: str, digest: str, rows: int, *,
           require_consistent_versions: bool = False) -> "Provenance":
        """A record of one answer."""
        return cls({(model, source, version, digest): rows}, require_consistent_versions)

    @classmethod
    def identity(cls) -> "Provenance":
        return cls()

    def rows(self) -> dict[Key, int]:
        """``{(model, source, version, digest): rows}``, sorted."""
        return dict(sorted(self.answered.items()))

    def versions(self, model: str) -> list[str]:
        """The versions of ``model`` that answered rows (in-process fallback rows aside)."""
        return sorted({key[2] for key in self.answered
                       if key[0] == model and key[1] != FALLBACK_SOURCE},
                      key=lambda v: (not v.isdigit(), int(v) if v.isdigit() else 0, v))

    def fallback_share(self, model: str) -> float:
        """The fraction of ``model``'s rows the in-process fallback computed."""
        total = sum(rows for key, rows in self.answered.items() if key[0] == model)
        fallback = sum(rows for key, rows in self.answered.items()
                       if key[0] == model and key[1] == FALLBACK_SOURCE)
        return fallback / total if total else 0.0

    def models(self) -> list[str]:
        return sorted({key[0] for key in self.answered})

    def describe(self) -> list[str]:
        """One line per model: who answered how many rows, and the fallback's share."""
        lines = []
        for model in self.models():
            parts = [f"{rows:,} rows by {source} v{version or '?'} (config {digest or '?'})"
                     for (name, source, version, digest), rows in self.rows().items()
                     if name == model]
            share = self.fallback_share(model)
            lines.append(f"{model}: " + "; ".join(parts)
                         + (f"; fallback share {share:.1%}" if share else ""))
        return lines

    def check(self) -> None:
        """Warn (or raise, if required) where a model was answered by several versions."""
        for model in self.models():
            versions = self.versions(model)
            if len(versions) < 2:
                continue
            counts = {v: sum(r for k, r in self.answered.items() if k[0] == model and k[2] == v)
                      for v in versions}
            message = (f"model {model!r} was answered by {len(versions)} versions: "
                       + ", ".join(f"version {v} ({rows:,} rows)" for v, rows in counts.items())
                       + "; pin one in the URL (.../model/VERSION) or finish the rolling update "
                       "before the run")
            if self.require_consistent_versions:
                raise InconsistentVersionsError(message)
            with _warned_lock:
                first = (model, tuple(versions)) not in _warned
                _warned.add((model, tuple(versions)))
            if first:
                logger.warning("coffea-sonic: %s", message)

    def __add__(self, other: Any) -> "Provenance":
        if not isinstance(other, Provenance):
            return NotImplemented
        total = Provenance(dict(self.answered), self.require_consistent_versions)
        total += other
        return total

    def __radd__(self, other: Any) -> "Provenance":
        if isinstance(other, int) and other == 0:
            return Provenance(dict(self.answered), self.require_consistent_versions)
        return NotImplemented

    def __iadd__(self, other: Any) -> "Provenance":
        if not isinstance(other, Provenance):
            return NotImplemented
        self.require_consistent_versions |= other.require_consistent_versions
        for key, rows in other.answered.items():
            self.answered[key] = self.answered.get(key, 0) + rows
        self.check()
        return self

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a record reaching the driver from Dask workers (where coffea reduces chunk outputs)
        # warns there too, where the user sees it
        self.__dict__.update(state)
        self.check()

    def to_dict(self) -> list[dict[str, Any]]:
        """Rows as plain records (for JSON summaries)."""
        return [{"model": m, "source": s, "version": v, "config_digest": d, "rows": r}
                for (m, s, v, d), r in self.rows().items()]


class ProvenanceHook(CallHooks):
    """Records every checked answer of a model into a :class:`Provenance` (thread-safe).

    :meth:`take` hands over what was recorded since the previous take (per chunk).
    """

    def __init__(self, require_consistent_versions: bool = False) -> None:
        self.require_consistent_versions = require_consistent_versions
        self._lock = threading.Lock()
        self._record = Provenance(require_consistent_versions=require_consistent_versions)

    def on_answer(self, answer: PieceAnswer) -> None:
        key = (answer.model, answer.source, answer.version, answer.piece.call.info.checksum)
        with self._lock:
            self._record.answered[key] = self._record.answered.get(key, 0) + answer.rows

    def take(self) -> Provenance:
        """The record since the previous take (checked for mixed versions), and a fresh one."""
        with self._lock:
            record = self._record
            self._record = Provenance(require_consistent_versions=self.require_consistent_versions)
        record.check()
        return record

    def __getstate__(self) -> dict[str, Any]:
        return {"require_consistent_versions": self.require_consistent_versions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["require_consistent_versions"])
