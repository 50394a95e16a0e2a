"""Inference statistics: client-side counters per model and server-side deltas from Triton.

How they add up over chunks, with examples: docs/internals/incidents.md.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, TypeVar

__all__ = ["Counters", "InferenceStats", "ServerStatistics", "counted_since", "settled"]

T = TypeVar("T")


class Counters:
    """Field-by-field arithmetic of a dataclass of counters: ``+``, ``-``, ``+=``, ``sum()``
    (starts from 0), :meth:`identity` and :meth:`copy`. The result is of the nearest dataclass
    in the class's ancestry, so a subclass that adds state (a lock, a file) sums to plain counters.

    >>> @dataclass
    ... class Seen(Counters):
    ...     hits: int = 0
    ...     misses: int = 0
    >>> sum([Seen(1, 2), Seen(3, 4)]), Seen(5, 5) - Seen(1, 2), Seen.identity()
    (Seen(hits=4, misses=6), Seen(hits=4, misses=3), Seen(hits=0, misses=0))
    """

    @classmethod
    def _counters_type(cls) -> type:
        return next(klass for klass in cls.__mro__ if "__dataclass_fields__" in vars(klass))

    def _combine(self, other: Any, sign: int) -> Any:
        kind = self._counters_type()
        if not isinstance(other, kind):
            return NotImplemented
        return kind(**{f.name: getattr(self, f.name) + sign * getattr(other, f.name)
                       for f in fields(kind)})

    def __add__(self, other: Any) -> Any:
        return self._combine(other, 1)

    def __sub__(self, other: Any) -> Any:
        return self._combine(other, -1)

    def __radd__(self, other: Any) -> Any:
        # sum([...]) starts from 0
        if isinstance(other, int) and other == 0:
            return self.copy()
        return NotImplemented

    def __iadd__(self, other: Any) -> Any:
        if not isinstance(other, self._counters_type()):
            return NotImplemented
        for f in fields(self._counters_type()):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    @classmethod
    def identity(cls) -> Any:
        """All-zero counters (the neutral element of ``+``)."""
        return cls._counters_type()()

    def copy(self) -> Any:
        """An independent copy (for putting into an output accumulator)."""
        kind = self._counters_type()
        return kind(**{f.name: getattr(self, f.name) for f in fields(kind)})


@dataclass
class InferenceStats(Counters):
    """Client-side counters of one model (or the sum over many chunks and workers).

    Times are seconds, sizes bytes. ``latency_s`` is the sum over requests of send-to-answer time;
    ``wait_s`` is how long callers were blocked in ``result()`` (small when CPU work overlapped
    the requests). ``fallback_*`` count work done in-process because no server could serve it.

    >>> stats = InferenceStats(requests=4, latency_s=0.2)
    >>> round(stats.mean_latency_s, 3)
    0.05
    >>> InferenceStats.identity() + stats == stats
    True
    """

    #: calls of the model (``__call__`` or ``infer_async``), including empty ones
    calls: int = 0
    #: gRPC inference requests that got a good answer
    requests: int = 0
    #: real input rows answered (zero-padding rows excluded), by servers and fallback alike
    rows: int = 0
    #: tensor payload bytes sent and received (protobuf framing excluded)
    bytes_sent: int = 0
    bytes_received: int = 0
    #: sum of per-request latencies, and time callers were blocked waiting for results
    latency_s: float = 0.0
    wait_s: float = 0.0
    #: requests sent again after a retryable failure; those that moved to another server
    retries: int = 0
    failovers: int = 0
    #: attempts that failed (retried or not)
    failed_requests: int = 0
    #: calls and rows computed by the in-process fallback engine
    fallback_calls: int = 0
    fallback_rows: int = 0
    #: blocks found in / missing from the persistent inference cache (:mod:`coffea_sonic.cache`),
    #: their rows, and the request bytes hits saved sending
    cache_hits: int = 0
    cache_misses: int = 0
    cache_hit_rows: int = 0
    cache_miss_rows: int = 0
    cache_bytes_saved: int = 0
    #: calls answered by an identical earlier call of the same chunk, without a request
    #: (:mod:`coffea_sonic.repeats`: e.g. a systematic variation that changes only weights), and
    #: their rows
    repeat_calls: int = 0
    repeat_rows: int = 0
    #: rows recomputed in-process by shadow validation, and comparisons over its tolerance
    #: (:mod:`coffea_sonic.shadow`)
    shadow_rows: int = 0
    shadow_alarms: int = 0
    #: seconds the shadow thread spent recomputing and comparing them
    shadow_s: float = 0.0

    @property
    def mean_latency_s(self) -> float:
        """Mean request latency (0 before the first request)."""
        return self.latency_s / self.requests if self.requests else 0.0

    def to_dict(self) -> dict[str, float]:
        """Plain ``{counter: value}``, e.g. for JSON reports."""
        return dataclasses.asdict(self)


@dataclass
class ServerStatistics(Counters):
    """Triton's cumulative inference statistics for one model, summed over versions and servers.

    Durations are kept in nanoseconds as Triton reports them; the ``*_s`` properties convert.

    >>> ServerStatistics(success_count=3, compute_infer_ns=3_000_000).compute_infer_s
    0.003
    """

    #: successful requests, and failed ones, as the server counted them
    success_count: int = 0
    fail_count: int = 0
    #: rows inferred, and model executions (their ratio is the server-side batch size)
    inference_count: int = 0
    execution_count: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    #: requests answered from Triton's response cache, and looked up there in vain (and the time
    #: those lookups took); zero where the model has no response cache
    cache_hit_count: int = 0
    cache_miss_count: int = 0
    cache_hit_ns: int = 0
    cache_miss_ns: int = 0

    @property
    def cache_hit_rate(self) -> float:
        """Share of cache lookups that hit (0 without lookups).

        >>> ServerStatistics(cache_hit_count=9, cache_miss_count=1).cache_hit_rate
        0.9
        """
        lookups = self.cache_hit_count + self.cache_miss_count
        return self.cache_hit_count / lookups if lookups else 0.0

    @property
    def queue_s(self) -> float:
        return self.queue_ns / 1e9

    @property
    def compute_input_s(self) -> float:
        return self.compute_input_ns / 1e9

    @property
    def compute_infer_s(self) -> float:
        return self.compute_infer_ns / 1e9

    @property
    def compute_output_s(self) -> float:
        return self.compute_output_ns / 1e9

    @property
    def average_batch(self) -> float:
        """Rows per model execution: how well the dynamic batcher filled the model."""
        return self.inference_count / self.execution_count if self.execution_count else 0.0

    def to_dict(self) -> dict[str, float]:
        """Counters plus the derived seconds and average batch."""
        out: dict[str, float] = dataclasses.asdict(self)
        out.update(queue_s=self.queue_s, compute_input_s=self.compute_input_s,
                   compute_infer_s=self.compute_infer_s, compute_output_s=self.compute_output_s,
                   average_batch=self.average_batch, cache_hit_rate=self.cache_hit_rate)
        return out

    @classmethod
    def from_model_stats(cls, model_stats: Any) -> "ServerStatistics":
        """Sum the ``model_stats`` entries of a gRPC ``ModelStatisticsResponse``."""
        total = cls()
        for entry in model_stats:
            stats = entry.inference_stats
            total += cls(
                success_count=int(stats.success.count), fail_count=int(stats.fail.count),
                inference_count=int(entry.inference_count),
                execution_count=int(entry.execution_count),
                queue_ns=int(stats.queue.ns), compute_input_ns=int(stats.compute_input.ns),
                compute_infer_ns=int(stats.compute_infer.ns),
                compute_output_ns=int(stats.compute_output.ns),
                cache_hit_count=int(stats.cache_hit.count),
                cache_miss_count=int(stats.cache_miss.count),
                cache_hit_ns=int(stats.cache_hit.ns), cache_miss_ns=int(stats.cache_miss.ns),
            )
        return total


def counted_since(read: Callable[[], "ServerStatistics"], before: "ServerStatistics",
                  requests: int, timeout_s: float = 5.0) -> "ServerStatistics":
    """``read() - before`` once it counts at least ``requests`` requests (answered or failed), or
    as it is after ``timeout_s``: Triton counts a request just after sending its answer, so a
    read right after a call may miss the call's last requests.

    >>> reads = iter([ServerStatistics(success_count=1), ServerStatistics(success_count=2)])
    >>> counted_since(lambda: next(reads), ServerStatistics(), 2).success_count
    2
    """
    deadline = time.monotonic() + timeout_s
    while True:
        delta = read() - before
        if delta.success_count + delta.fail_count >= requests or time.monotonic() >= deadline:
            return delta
        time.sleep(0.01)


def settled(read: Callable[[], T], gap_s: float = 0.05, timeout_s: float = 10.0) -> T:
    """``read()`` once two reads ``gap_s`` apart agree, or the last read after ``timeout_s``:
    where the calls a count should hold are not known, wait until the server has counted
    whatever was answered (Triton counts a request just after sending its answer).

    >>> reads = iter([1, 2, 2])
    >>> settled(lambda: next(reads), gap_s=0.0)
    2
    """
    deadline = time.monotonic() + timeout_s
    previous = read()
    while time.monotonic() < deadline:
        time.sleep(gap_s)
        now = read()
        if now == previous:
            return now
        previous = now
    return previous
