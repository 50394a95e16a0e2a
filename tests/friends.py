"""Friend columns: a run's per-event outputs kept beside the data, read back instead of asking a
server.

Inside ``process``, :meth:`FriendColumns.write` stores columns with one entry per event (jagged
or flat awkward arrays, numpy arrays) for the chunk's file and entry range as a Parquet file::

    <root>/<file uuid>/<treename>/<entrystart>-<entrystop>.parquet

A later run (or another analysis) calls :meth:`FriendColumns.read` with its own chunk: the pieces
that overlap its entry range are read, sliced and joined, so a different chunk size still reads
them; if any entry of the range is missing it returns None (ask the server then). The file's
UUID (coffea's ``events.metadata["fileuuid"]``) names the folder, so moved or renamed copies of a
ROOT file find the same friends. Writes are atomic (temporary file + rename).

>>> import tempfile, awkward as ak, numpy as np
>>> friends = FriendColumns(tempfile.mkdtemp())
>>> meta = {"fileuuid": "ab12", "treename": "Events", "entrystart": 0, "entrystop": 4}
>>> _ = friends.write_range(meta, {"score": ak.Array([[0.1], [], [0.2, 0.3], [0.4]])})
>>> _ = friends.write_range({**meta, "entrystart": 4, "entrystop": 6}, {"score": ak.Array([[], [0.5]])})
>>> friends.read_range({**meta, "entrystart": 3, "entrystop": 6})["score"].tolist()
[[0.4], [], [0.5]]
>>> friends.read_range({**meta, "entrystart": 5, "entrystop": 7}) is None
True
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any, Mapping

import awkward as ak

from coffea_sonic.errors import InputValidationError

__all__ = ["FriendColumns"]

_PIECE = re.compile(r"^(\d+)-(\d+)\.parquet$")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class FriendColumns:
    """Per-event columns of earlier runs under ``root`` (see the module). Picklable."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"FriendColumns({str(self.root)!r})"

    def _folder(self, metadata: Mapping[str, Any]) -> Path:
        uuid = metadata.get("fileuuid")
        if isinstance(uuid, (bytes, bytearray)):
            uuid = uuid.hex()
        if not uuid:
            raise InputValidationError(
                "friend columns need the chunk's file UUID (events.metadata['fileuuid'], set by "
                f"coffea's Runner); got metadata keys {sorted(metadata)}")
        tree = str(metadata.get("treename") or "Events")
        return self.root / _SAFE.sub("_", str(uuid)) / _SAFE.sub("_", tree)

    # -- writing ------------------------------------------------------------------------------
    def write(self, events: Any, columns: Mapping[str, Any]) -> Path:
        """Store ``columns`` (one entry per event of ``events``) for this chunk."""
        return self.write_range(events.metadata, columns, len(events))

    def write_range(self, metadata: Mapping[str, Any], columns: Mapping[str, Any],
                    events: int | None = None) -> Path:
        """Store ``columns`` for entries ``entrystart:entrystop`` of the file in ``metadata``."""
        start, stop = int(metadata["entrystart"]), int(metadata["entrystop"])
        arrays = {name: ak.Array(value) if not isinstance(value, ak.Array) else value
                  for name, value in columns.items()}
        for name, array in arrays.items():
            if len(array) != stop - start or (events is not None and len(array) != events):
                raise InputValidationError(
                    f"friend column {name!r} has {len(array)} entries for a chunk of "
                    f"{stop - start} events (entries {start}-{stop}); give one entry per event")
        folder = self._folder(metadata)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{start}-{stop}.parquet"
        temp = folder / f".tmp-{os.getpid()}-{secrets.token_hex(4)}.parquet"
        try:
            ak.to_parquet(ak.zip(arrays, depth_limit=1), temp)
            os.replace(temp, target)
        finally:
            if temp.exists():
                temp.unlink()
        return target

    # -- reading ------------------------------------------------------------------------------
    def pieces(self, metadata: Mapping[str, Any]) -> list[tuple[int, int, Path]]:
        """Every stored (start, stop, path) of the file in ``metadata``, by start."""
        folder = self._folder(metadata)
        if not folder.is_dir():
            return []
        found = []
        for path in folder.iterdir():
            match = _PIECE.match(path.name)
            if match:
                found.append((int(match.group(1)), int(match.group(2)), path))
        return sorted(found, key=lambda piece: (piece[0], -piece[1]))

    def read(self, events: Any, columns: list[str] | None = None) -> ak.Array | None:
        """This chunk's friend columns (a record array, one entry per event), or None if any
        of its entries has none."""
        return self.read_range(events.metadata, columns)

    def read_range(self, metadata: Mapping[str, Any], columns: list[str] | None = None
                   ) -> ak.Array | None:
        """The friend columns of entries ``entrystart:entrystop``, or None if not all stored."""
        start, stop = int(metadata["entrystart"]), int(metadata["entrystop"])
        parts = []
        position = start
        for piece_start, piece_stop, path in self.pieces(metadata):
            if piece_stop <= position or piece_start > position:
                if piece_start > position:
                    break  # a gap: entries position..piece_start are not stored
                continue
            stored = ak.from_parquet(path, columns=columns)
            upto = min(piece_stop, stop)
            parts.append(stored[position - piece_start:upto - piece_start])
            position = upto
            if position >= stop:
                break
        if position < stop:
            return None
        return parts[0] if len(parts) == 1 else ak.concatenate(parts)
