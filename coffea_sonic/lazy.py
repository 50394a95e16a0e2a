"""Packages that import their public names on first use, so ``import coffea_sonic`` stays fast.

How names (and names that moved) are resolved, with examples: docs/internals/client.md.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str], namespace: dict[str, Any],
                 also: Iterable[str] = (), moved: Mapping[str, str] | None = None,
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: a listed name is imported from its module
    on first use and kept in ``namespace`` (the package's globals); ``dir()`` lists the exports
    and ``also``. A ``moved`` name is still found, warns at each import, and is not listed."""
    listed = sorted({*exports, *also})
    moved = dict(moved or {})

    def _load(name: str, module_name: str) -> Any:
        module = importlib.import_module(module_name, package)
        if module.__name__.rpartition(".")[2] == name:
            return module
        return getattr(module, name)

    def __getattr__(name: str) -> Any:
        module_name = exports.get(name)
        if module_name is None:
            new_home = moved.get(name)
            if new_home is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            # `from package import name` asks twice: importlib's hasattr (in _handle_fromlist),
            # then the importing code itself, which is the frame to warn at (stacklevel 2)
            if sys._getframe(1).f_code.co_name == "_handle_fromlist":
                return _load(name, new_home)
            warnings.warn(f"{package}.{name} moved: import it as `from {new_home} import {name}` "
                          "(the old import works for one release)", DeprecationWarning,
                          stacklevel=2)
            return _load(name, new_home)
        value = _load(name, module_name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return list(listed)

    return __getattr__, __dir__
