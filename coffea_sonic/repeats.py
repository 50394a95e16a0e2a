"""Identical calls within one chunk are sent once.

How it works, with examples: docs/internals/dispatch.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from typing import Any, Iterator, Mapping

import numpy as np

__all__ = ["chunk_memo", "key_of", "recall", "remember"]

_memo: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "coffea_sonic_chunk_memo", default=None)


@contextlib.contextmanager
def chunk_memo(enabled: bool = True) -> Iterator[None]:
    """Calls inside the block (one chunk's ``process``) share answers of identical inputs."""
    token = _memo.set({} if enabled else None)
    try:
        yield
    finally:
        _memo.reset(token)


def _digest_array(hasher: Any, array: Any) -> None:
    value = np.ascontiguousarray(np.asarray(array))
    hasher.update(f"{value.dtype.str}{value.shape}".encode())
    hasher.update(memoryview(value).cast("B") if value.size else b"")


def key_of(model: str, rows: Mapping[str, np.ndarray], counts: Any, ragged: bool) -> str | None:
    """The memo key of a call, or None outside a chunk (or with the memo off)."""
    if _memo.get() is None:
        return None
    hasher = hashlib.blake2b(digest_size=20)
    hasher.update(f"{model}|{ragged}|{sorted(rows)}".encode())
    for name in sorted(rows):
        _digest_array(hasher, rows[name])
    levels = counts if isinstance(counts, tuple) else (() if counts is None else (counts,))
    for level in levels:
        _digest_array(hasher, level)
    return hasher.hexdigest()


def recall(key: str | None) -> Any:
    """The earlier result of an identical call of this chunk, or None."""
    memo = _memo.get()
    return None if key is None or memo is None else memo.get(key)


def remember(key: str | None, result: Any) -> None:
    """Keep ``result`` for identical calls later in this chunk."""
    memo = _memo.get()
    if key is not None and memo is not None:
        memo[key] = result
