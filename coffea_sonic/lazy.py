"""Packages that import their public names on first use, so ``import coffea_sonic`` stays fast.

A package lists ``{public name: module}`` (absolute, or relative to the package with a leading
dot) and takes its module-level ``__getattr__`` and ``__dir__`` from :func:`lazy_exports`.

>>> getattr_, dir_ = lazy_exports("json", {"dumps": "json", "JSONDecoder": ".decoder"}, {})
>>> getattr_("dumps")({"a": 1}), getattr_("JSONDecoder").__name__, dir_()
('{"a": 1}', 'JSONDecoder', ['JSONDecoder', 'dumps'])
>>> getattr_("nope")
Traceback (most recent call last):
AttributeError: module 'json' has no attribute 'nope'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str], namespace: dict[str, Any],
                 also: Iterable[str] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: a listed name is imported from its module
    on first use and kept in ``namespace`` (the package's globals); ``dir()`` lists the exports
    and ``also``."""
    listed = sorted({*exports, *also})

    def __getattr__(name: str) -> Any:
        module_name = exports.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return list(listed)

    return __getattr__, __dir__
