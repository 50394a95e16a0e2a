"""Per-process state a forked child must not share (why: docs/internals/core.md)."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Callable, Generic, Hashable, TypeVar

__all__ = ["ProcessLocal"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: every ProcessLocal of this process, reset in a forked child
_instances: "weakref.WeakSet[ProcessLocal]" = weakref.WeakSet()


class ProcessLocal(Generic[K, V]):
    """A dict and its lock, both this process' own; ``name`` says what it holds (in its repr).
    Values are never None (None means absent).

    >>> ProcessLocal("example").get("key", lambda: 1)
    1
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._values: dict[K, V] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        #: the parent's values, kept referenced and never touched in this process
        self._inherited: list[dict[K, V]] = []
        _instances.add(self)

    def __repr__(self) -> str:
        return f"ProcessLocal({self.name!r}, {len(self._values)} values, pid {self._pid})"

    @property
    def lock(self) -> threading.Lock:
        """This process' lock of the values (hold it to make several changes at once)."""
        self._own()
        return self._lock

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value of ``key``, made by ``make()`` (once, under the lock) if absent."""
        self._own()
        value = self._values.get(key)
        if value is not None:
            return value
        with self._lock:
            value = self._values.get(key)
            if value is None:
                value = self._values[key] = make()
            return value

    def peek(self, key: K) -> V | None:
        """The value of ``key``, or None (nothing is made)."""
        self._own()
        return self._values.get(key)

    def set(self, key: K, value: V) -> None:
        self._own()
        self._values[key] = value

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Remove ``key``; its value, or ``default``."""
        self._own()
        return self._values.pop(key, default)

    def values(self) -> list[V]:
        """A snapshot of this process' values."""
        self._own()
        return list(self._values.values())

    def items(self) -> list[tuple[K, V]]:
        self._own()
        return list(self._values.items())

    def clear(self) -> list[V]:
        """Forget every value of this process; returns them (e.g. to close them)."""
        self._own()
        with self._lock:
            values = list(self._values.values())
            self._values.clear()
        return values

    def __len__(self) -> int:
        self._own()
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        self._own()
        return key in self._values

    def _own(self) -> None:
        if self._pid != os.getpid():  # forked without the at-fork hook (os.fork in C code)
            self._after_fork()

    def _after_fork(self) -> None:
        self._inherited.append(self._values)
        self._values = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()


def _after_fork_in_child() -> None:
    for local in list(_instances):
        local._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
