"""A persistent inference cache on the client, keyed by content (docs/internals/caches.md)."""

from __future__ import annotations

import os
from typing import Union

from ..core.settings import setting
from ..errors import ConfigurationError
from .counters import CacheCounters, read_counters
from .disk import DEFAULT_MAX_BYTES, InferenceCache, parse_size
from .lookup import infer_cached

__all__ = ["CacheCounters", "CacheChoice", "DEFAULT_MAX_BYTES", "InferenceCache", "infer_cached",
           "parse_size", "read_counters", "resolve_cache"]

CacheChoice = Union[str, "os.PathLike[str]", InferenceCache, bool, None]


def resolve_cache(choice: CacheChoice, max_bytes: int | str | None = None
                  ) -> InferenceCache | None:
    """The cache a ``TritonModel`` uses: a directory, an :class:`InferenceCache`, False (off),
    or None (the ``inference_cache`` setting; off when unset).

    >>> resolve_cache(False) is None
    True
    """
    if choice is False or choice == "":
        return None
    if isinstance(choice, InferenceCache):
        return choice
    if choice is None or choice is True:
        wanted = choice
        choice = setting("inference_cache", None)
        if not choice or str(choice).strip().lower() in ("0", "off", "false", "no"):
            if wanted is True:
                raise ConfigurationError(
                    "cache=True needs a directory: pass cache=DIR or set "
                    "COFFEA_SONIC_INFERENCE_CACHE=DIR")
            return None
    if max_bytes is None:
        max_bytes = setting("inference_cache_size", DEFAULT_MAX_BYTES)
    return InferenceCache(os.fspath(choice), max_bytes=max_bytes)
