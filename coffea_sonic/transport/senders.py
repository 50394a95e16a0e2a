"""Threads that make blocking gRPC calls (why: docs/internals/transport.md, Sending)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..core.process_local import ProcessLocal

__all__ = ["SENDER_THREADS", "send_soon", "sender_pool"]

logger = logging.getLogger(__name__)

#: enough for every model's window to be in flight at once.
SENDER_THREADS = 16
_senders: ProcessLocal[int, ThreadPoolExecutor] = ProcessLocal("gRPC sender threads")
#: per sender thread: whether it runs a task now, and the one task it keeps for after it
_running = threading.local()


def sender_pool() -> ThreadPoolExecutor:
    """This process' sender threads (a forked child makes its own)."""
    return _senders.get(SENDER_THREADS, lambda: ThreadPoolExecutor(
        SENDER_THREADS, thread_name_prefix="csonic-grpc"))


def send_soon(work: Callable[..., None], *args: Any) -> None:
    """Run ``work(*args)`` on a sender thread: this one right after its current task when it is
    a sender thread that keeps nothing yet, else the next free one. ``work`` handles its own
    errors (one that escapes is logged)."""
    if getattr(_running, "active", False) and _running.kept is None:
        _running.kept = (work, args)
        return
    sender_pool().submit(_run, work, args)


def _run(work: Callable[..., None], args: tuple[Any, ...]) -> None:
    """A sender thread's task, then the task it kept while running it, and so on."""
    _running.active = True
    task: tuple[Callable[..., None], tuple[Any, ...]] | None = (work, args)
    try:
        while task is not None:
            _running.kept = None
            try:
                task[0](*task[1])
            except Exception:  # noqa: BLE001 - a sender thread must go on with the next task
                logger.exception("coffea-sonic: a sender task failed")
            task = _running.kept
    finally:
        _running.active = False
        _running.kept = None
