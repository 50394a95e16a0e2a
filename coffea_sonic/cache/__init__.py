"""A persistent inference cache on the client: outputs kept across runs, keyed by content.

``TritonModel(url, cache="/shared/sonic-cache")`` (or the setting ``inference_cache``:
``COFFEA_SONIC_INFERENCE_CACHE=DIR``, Dask config ``coffea_sonic.inference_cache``; off by
default) looks every call's rows up in a directory before sending them, and stores what the
servers answer. Keys: model name, served version, the served config's digest
(``ModelInfo.checksum``) and an XXH3-128 hash of each block's input bytes; blocks are cut by the
rows' content, so a run with another chunk size still hits wherever its blocks line up.

* :mod:`.key`: content-defined blocks and their keys;
* :mod:`.store`: one entry on disk (atomic write, checksum checked on read);
* :mod:`.eviction`: the size limit (``inference_cache_size``, default 20 GB), oldest first;
* :mod:`.counters`: hits, misses, bytes saved per process, summed by ``monitor --inference-cache DIR``;
* :mod:`.disk`: :class:`InferenceCache`, the directory;
* :mod:`.lookup`: one call through the cache.

>>> resolve_cache(False) is None
True
>>> import tempfile
>>> resolve_cache(tempfile.gettempdir(), max_bytes="1GB").max_bytes
1000000000
"""

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
    or None (the ``inference_cache`` setting; off when unset)."""
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
