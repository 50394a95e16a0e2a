"""A script that starts worker processes must guard its module-level code: :func:`check_main_guard`.

Why: docs/internals/facility.md, "The main guard".

>>> import ast
>>> [_is_main_test(ast.parse(test, mode="eval").body)
...  for test in ('__name__ == "__main__"', '"__main__" == __name__', '__name__ != "__main__"')]
[True, True, False]
"""

from __future__ import annotations

import ast
import os
import sys

from ..errors import ClusterStartError

__all__ = ["check_main_guard", "unguarded_main_line"]


def _is_main_test(test: ast.expr) -> bool:
    """Whether ``test`` is ``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return bool(names and mains)


def unguarded_main_line() -> int | None:
    """The line of the running script's module-level code that led here, where it is not under
    ``if __name__ == "__main__":``; None when it is guarded, or no script runs (Jupyter, -c)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not str(path).endswith(".py") or not os.path.isfile(path):
        return None
    path = os.path.abspath(path)
    frame = sys._getframe(1)
    while frame is not None:
        if (frame.f_code.co_name == "<module>"
                and frame.f_globals.get("__name__") in ("__main__", "__mp_main__")
                and os.path.abspath(frame.f_code.co_filename) == path):
            break
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.If) and _is_main_test(node.test)
                and node.lineno <= line <= (node.end_lineno or node.lineno)):
            return None
    return line


def check_main_guard() -> None:
    """Raise :class:`~coffea_sonic.errors.ClusterStartError` at once where an unguarded script is
    about to start local worker processes (why: docs/internals/facility.md)."""
    line = unguarded_main_line()
    if line is None:
        return
    script = os.path.basename(str(getattr(sys.modules["__main__"], "__file__", "your script")))
    raise ClusterStartError(
        f"{script}:{line} starts local Dask worker processes from module-level code. Each worker "
        "imports the script again and would start its own cluster (it hangs for minutes). Put "
        "the run under `if __name__ == \"__main__\":` (or use processes=False, or run it in "
        "Jupyter)")
