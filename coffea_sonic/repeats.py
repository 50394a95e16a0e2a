"""Identical calls within one chunk are sent once.

An analysis' systematic loop runs its inference once per variation, and a variation that only
changes weights feeds the model exactly the nominal inputs again (the Analysis Grand Challenge:
4 of 7 calls per chunk). While :class:`~coffea_sonic.SonicMixin` runs a chunk's ``process``, a
call whose model, version, inputs and structure equal an earlier call's of the same chunk gets
that call's answer (a copy) without a request; ``InferenceStats.repeat_calls`` /
``repeat_rows`` count them and the run's summary says how many requests they saved. Inputs are
compared by a BLAKE2b digest of their bytes, dtype and shape (about 1 ms per MB). Only within a
chunk: nothing outlives it. A processor turns it off with ``sonic_repeats = False``.

>>> import numpy as np
>>> with chunk_memo():
...     first = key_of("m", {"x": np.arange(4.0)}, None, False)
...     first == key_of("m", {"x": np.arange(4.0)}, None, False), first == key_of("m", {"x": np.arange(5.0)}, None, False)
(True, False)
>>> key_of("m", {"x": np.arange(4.0)}, None, False) is None   # outside a chunk: no memo
True
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
