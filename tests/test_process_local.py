"""ProcessLocal: a forked child starts empty with a free lock, and never touches the parent's values."""

from __future__ import annotations

import json
import os
import threading

from coffea_sonic.core.process_local import ProcessLocal


def _in_child(work) -> dict:
    """Run ``work()`` in a forked child; its JSON result (the child exits at once)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's exit handlers
        try:
            os.write(write, json.dumps(work()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    assert os.waitpid(pid, 0)[1] == 0
    return json.loads(answer)


def test_a_forked_child_starts_empty_and_makes_its_own_values():
    closed = []

    class Resource:
        def __del__(self) -> None:
            closed.append(os.getpid())

    local: ProcessLocal[str, Resource] = ProcessLocal("resources")
    parent_value = local.get("a", Resource)

    def child() -> dict:
        before = len(local)
        made = local.get("a", Resource)
        return {"before": before, "new": made is not parent_value, "after": len(local),
                "closed_here": closed.count(os.getpid())}

    assert _in_child(child) == {"before": 0, "new": True, "after": 1, "closed_here": 0}
    assert local.peek("a") is parent_value and len(local) == 1


def test_a_lock_held_by_another_thread_at_fork_time_is_free_in_the_child():
    local: ProcessLocal[str, int] = ProcessLocal("numbers")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with local.lock:
            held.set()
            release.wait(timeout=30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(timeout=10)
        answer = _in_child(lambda: {"value": local.get("x", lambda: 7),
                                    "free": local.lock.acquire(timeout=5)})
    finally:
        release.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert answer == {"value": 7, "free": True}
    assert local.peek("x") is None  # the child's value stayed in the child
