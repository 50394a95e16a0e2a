"""SuperSONIC's autoscaling load: queue time per model execution over a pool of servers, in ms.

How it works, with an example: docs/internals/facility.md, "SuperSONIC's autoscaling load".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["DEFAULT_RELEASE", "DEFAULT_THRESHOLD_MS", "load_ms", "supersonic_query", "verdict"]

#: SuperSONIC's default threshold of its load metric, in ms of queue time per execution.
DEFAULT_THRESHOLD_MS = 100.0
#: The ``release`` label the deployment's metrics carry (deploy/kubernetes).
DEFAULT_RELEASE = "coffea-sonic"


def supersonic_query(release: str | None = DEFAULT_RELEASE, window: str = "30s") -> str:
    """The PromQL of the load metric, in ms, for the servers labelled ``release`` (None: all)."""
    selector = f'{{release="{release}"}}' if release else ""
    return (f"sum by (release) (rate(nv_inference_queue_duration_us{selector}[{window}])) / "
            f"sum by (release) ((rate(nv_inference_exec_count{selector}[{window}]) * 1000) + 0.001)")


def load_ms(pairs: Sequence[tuple[Any, Any]]) -> float | None:
    """The load over every server and model of ``(previous, current)`` scrapes, in ms.

    Scrapes are :class:`~coffea_sonic.facility.monitor.Snapshot`; pairs without a previous scrape
    or with an error are left out. None when no execution happened in between (no load to judge).

    >>> from coffea_sonic.facility.monitor import ModelCounters, Snapshot
    >>> before = Snapshot("a", 0.0, {("m", "1"): ModelCounters("m", "1", executions=10, queue_us=0)})
    >>> after = Snapshot("a", 1.0, {("m", "1"): ModelCounters("m", "1", executions=20,
    ...                                                         queue_us=50_000)})
    >>> load_ms([(before, after)]), load_ms([(None, after)])
    (5.0, None)
    """
    queue_us = executions = 0.0
    for previous, current in pairs:
        if previous is None or previous.error or current.error:
            continue
        for key, now in current.models.items():
            then = previous.models.get(key)
            queue_us += now.queue_us - (then.queue_us if then else 0.0)
            executions += now.executions - (then.executions if then else 0.0)
    return queue_us / executions / 1e3 if executions > 0 else None


def verdict(load: float | None, threshold_ms: float = DEFAULT_THRESHOLD_MS, *, servers: int = 1) -> str:
    """One line: the load against ``threshold_ms``, and what an autoscaler would do.

    >>> verdict(None, 100.0)
    'autoscaling load: no executions in this interval (nothing to scale on)'
    """
    if load is None:
        return "autoscaling load: no executions in this interval (nothing to scale on)"
    where = f"over {servers} server{'s' if servers != 1 else ''}"
    if load > threshold_ms:
        judged = f"ABOVE the {threshold_ms:g} ms threshold (scale out: add servers)"
    else:
        judged = f"below the {threshold_ms:g} ms threshold"
    return f"autoscaling load {load:.1f} ms queue per execution {where}: {judged}"
