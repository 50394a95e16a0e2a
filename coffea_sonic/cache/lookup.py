"""One call through the cache: send only the rows not found (docs/internals/caches.md)."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ..core.tensors import ModelInfo
from .disk import InferenceCache
from .key import block_key, call_key, content_blocks

__all__ = ["CachePlan", "ReadyHandle", "StoringHandle", "cacheable", "infer_cached"]

logger = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]
#: ``submit(arrays, rows)`` sends validated rows as a normal call and returns its handle
Submit = Callable[[Arrays, int], Any]


def cacheable(info: ModelInfo, arrays: Mapping[str, np.ndarray]) -> bool:
    """Whether a call can be cached at all (no BYTES inputs or outputs)."""
    return all(t.dtype != object for t in info.outputs) and all(
        a.dtype != object for a in arrays.values())


def _by_block(info: ModelInfo, ragged: bool) -> bool:
    """Whether rows can be looked up in blocks: a batching model, fixed output rows."""
    return (info.batching and not ragged
            and all(d >= 0 for t in info.outputs for d in t.dims))


@dataclass
class CachePlan:
    """Which blocks of a call were found and which are to be computed."""

    namespace: Path
    rows: int
    blocks: list[tuple[int, int]]
    keys: list[str]
    found: dict[int, Arrays] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    #: the whole call is one entry (ragged, no batching): outputs are stored as they are
    whole: bool = False

    def missing_arrays(self, arrays: Arrays) -> tuple[Arrays, int]:
        """The rows of the missing blocks, in order (the call's own arrays if all are)."""
        if len(self.missing) == len(self.blocks):
            return arrays, self.rows
        spans = [self.blocks[i] for i in self.missing]
        sub = {name: np.concatenate([array[a:b] for a, b in spans]) for name, array in arrays.items()}
        return sub, sum(b - a for a, b in spans)

    def merge(self, computed: Arrays | None) -> Arrays:
        """The call's outputs: found blocks and computed rows in input order."""
        if self.whole:
            if computed is not None:
                return dict(computed)
            return {name: array.copy() for name, array in self.found[0].items()}
        if not self.found and computed is not None:
            return computed
        template = computed if computed is not None else next(iter(self.found.values()))
        out = {name: np.empty((self.rows, *array.shape[1:]), dtype=array.dtype)
               for name, array in template.items()}
        for index, outputs in self.found.items():
            start, stop = self.blocks[index]
            for name, target in out.items():
                target[start:stop] = outputs[name]
        offset = 0
        for index in self.missing:
            start, stop = self.blocks[index]
            for name, target in out.items():
                target[start:stop] = computed[name][offset:offset + stop - start]
            offset += stop - start
        return out

    def store(self, cache: InferenceCache, computed: Arrays) -> None:
        """Write the computed blocks (a failed write is logged: the answer is still right)."""
        offset = 0
        for index in self.missing:
            start, stop = self.blocks[index]
            if self.whole:
                outputs = computed
            else:
                outputs = {name: array[offset:offset + stop - start]
                           for name, array in computed.items()}
            offset += stop - start
            try:
                cache.put(self.namespace, self.keys[index], outputs)
            except OSError as error:
                logger.warning("coffea-sonic cache: could not store an entry in %s: %s",
                               self.namespace, error)
                return


def plan_call(cache: InferenceCache, info: ModelInfo, version: str, arrays: Arrays, rows: int,
              counts: np.ndarray | None) -> CachePlan:
    """Key every block of the call and look each up."""
    namespace = cache.namespace(info, version)
    if _by_block(info, counts is not None):
        blocks = content_blocks(arrays, rows)
        keys = [block_key(arrays, start, stop) for start, stop in blocks]
        plan = CachePlan(namespace, rows, blocks, keys)
    else:
        plan = CachePlan(namespace, rows, [(0, rows)], [call_key(arrays, counts)], whole=True)
    for index, key in enumerate(plan.keys):
        outputs = cache.get(namespace, key)
        if outputs is None:
            plan.missing.append(index)
        else:
            plan.found[index] = outputs
    return plan


def infer_cached(cache: InferenceCache, info: ModelInfo, version: str, arrays: Arrays, rows: int,
                 counts: np.ndarray | None, submit: Submit,
                 add_stats: Callable[..., None]) -> Any:
    """Answer what the cache holds, send the rest through ``submit``; returns a handle."""
    plan = plan_call(cache, info, version, arrays, rows, counts)
    hit_rows = sum(plan.blocks[i][1] - plan.blocks[i][0] for i in plan.found)
    row_bytes = sum(array.nbytes for array in arrays.values()) / max(rows, 1)
    counted = dict(cache_hits=len(plan.found), cache_misses=len(plan.missing),
                   cache_hit_rows=hit_rows, cache_miss_rows=rows - hit_rows,
                   cache_bytes_saved=int(round(hit_rows * row_bytes)))
    add_stats(**counted)
    cache.counters.add(hits=counted["cache_hits"], misses=counted["cache_misses"],
                       hit_rows=hit_rows, miss_rows=rows - hit_rows,
                       bytes_saved=counted["cache_bytes_saved"])
    if not plan.missing:
        cache.counters.flush()
        return ReadyHandle(plan.merge(None))
    sub_arrays, sub_rows = plan.missing_arrays(arrays)
    return StoringHandle(submit(sub_arrays, sub_rows), plan, cache)


class ReadyHandle(Future):
    """A call answered wholly from the cache (a future already done)."""

    def __init__(self, outputs: Arrays) -> None:
        super().__init__()
        self.set_result(outputs)


class StoringHandle:
    """A call partly sent: on ``result()`` the computed blocks are stored and merged in."""

    def __init__(self, inner: Any, plan: CachePlan, cache: InferenceCache) -> None:
        self._inner = inner
        self._plan = plan
        self._cache = cache
        self._outputs: Arrays | None = None

    def done(self) -> bool:
        return self._inner.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._inner.exception(timeout)

    def cancel(self) -> None:
        self._inner.cancel()

    def result(self, timeout: float | None = None) -> Arrays:
        if self._outputs is None:
            computed = self._inner.result(timeout)
            # the fallback engine's answers are handed out but never stored as the model's
            if not getattr(getattr(self._inner, "_call", None), "fallback", False):
                self._plan.store(self._cache, computed)
            self._cache.counters.flush()
            self._outputs = self._plan.merge(computed)
        return self._outputs
