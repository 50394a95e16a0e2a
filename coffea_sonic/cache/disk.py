"""``InferenceCache``: a directory of model outputs (layout: docs/internals/caches.md)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import threading
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..core.tensors import ModelInfo, TensorInfo
from ..errors import ConfigurationError
from .counters import CacheCounters, process_counters
from .eviction import SizeLimit, touch
from .store import ENTRY_SUFFIX, read_entry, write_entry

__all__ = ["DEFAULT_MAX_BYTES", "InferenceCache", "parse_size"]

logger = logging.getLogger(__name__)

#: the size limit when none is given (``COFFEA_SONIC_INFERENCE_CACHE_SIZE``)
DEFAULT_MAX_BYTES = 20 * 10**9
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def parse_size(value: int | str, what: str = "inference cache size") -> int:
    """Bytes from ``1000000``, ``"500MB"``, ``"2 GiB"``.

    >>> parse_size("2 GiB"), parse_size("500MB"), parse_size(10)
    (2147483648, 500000000, 10)
    """
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(value))
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _UNITS:
            raise ConfigurationError(
                f"{what} {value!r} is not a size such as 500MB, 20GB or 2GiB")
        size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ConfigurationError(f"{what} must be > 0 bytes, not {value!r}")
    return size


def _info_from_json(data: Mapping[str, Any]) -> ModelInfo:
    known = {field.name for field in dataclasses.fields(ModelInfo)}
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name not in known:
            continue
        if name in ("inputs", "outputs"):
            value = tuple(TensorInfo(t["name"], t["datatype"], tuple(t["dims"])) for t in value)
        elif isinstance(value, list):
            value = tuple(value)
        values[name] = value
    return ModelInfo(**values)


class InferenceCache:
    """A persistent, shareable cache of model outputs under ``root``; pickles as path and limit.

    >>> InferenceCache("/tmp/sonic-cache", max_bytes="2 GiB").max_bytes
    2147483648
    """

    def __init__(self, root: str | os.PathLike[str], *, max_bytes: int | str = DEFAULT_MAX_BYTES
                 ) -> None:
        self.root = Path(root).expanduser().resolve()
        self.max_bytes = parse_size(max_bytes)
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._limit = SizeLimit(self.root, self.max_bytes)
        self._remembered: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"root": str(self.root), "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.root = Path(state["root"])
        self.max_bytes = int(state["max_bytes"])
        self._init_process_state()

    def __repr__(self) -> str:
        return f"InferenceCache({str(self.root)!r}, max_bytes={self.max_bytes})"

    @property
    def counters(self) -> CacheCounters:
        """This process' counters for this directory (all models)."""
        return process_counters(self.root)

    def namespace(self, info: ModelInfo, version: str) -> Path:
        """The folder of ``info``'s entries at ``version`` (recorded in ``served.json``)."""
        model_dir = self.root / _SAFE.sub("_", info.name) / _SAFE.sub("_", version)
        marker = (info.name, version, info.checksum)
        if marker not in self._remembered:
            try:
                self._remember(model_dir, info)
            except OSError as error:  # a read-only cache still answers what it holds
                logger.warning("coffea-sonic cache: cannot write %s: %s", model_dir, error)
            with self._lock:
                self._remembered.add(marker)
        return model_dir / _SAFE.sub("_", info.checksum)

    def _remember(self, model_dir: Path, info: ModelInfo) -> None:
        path = model_dir / "served.json"
        text = json.dumps(dataclasses.asdict(info), sort_keys=True)
        try:
            if path.read_text() == text:
                return
        except OSError:
            pass
        model_dir.mkdir(parents=True, exist_ok=True)
        temp = model_dir / f".served.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}"
        temp.write_text(text)
        os.replace(temp, path)

    def offline_info(self, model: str, version: str) -> ModelInfo | None:
        """What ``model`` at ``version`` last served through this cache (None if never)."""
        path = self.root / _SAFE.sub("_", model) / _SAFE.sub("_", version) / "served.json"
        try:
            return _info_from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _path(self, namespace: Path, key: str) -> Path:
        return namespace / key[:2] / (key + ENTRY_SUFFIX)

    def get(self, namespace: Path, key: str) -> dict[str, np.ndarray] | None:
        """The stored outputs of ``key`` (read-only arrays), or None (absent or corrupt)."""
        path = self._path(namespace, key)
        outputs, corrupt = read_entry(path)
        if corrupt:
            self.counters.add(corrupt=1)
        if outputs is not None:
            touch(path)
        return outputs

    def put(self, namespace: Path, key: str, outputs: Mapping[str, np.ndarray]) -> int:
        """Store ``outputs`` under ``key`` atomically; returns the bytes written."""
        size = write_entry(self._path(namespace, key), outputs)
        self.counters.add(stored=1, stored_bytes=size)
        self._limit.wrote(size)
        return size

    def evict_now(self) -> int:
        """Apply the size limit now; returns the entries deleted."""
        return self._limit.evict()

    def usage(self) -> tuple[int, int]:
        """(entries, bytes) in the directory now (a scan)."""
        from .eviction import scan

        entries, _ = scan(self.root)
        return len(entries), sum(size for _, size, _ in entries)
