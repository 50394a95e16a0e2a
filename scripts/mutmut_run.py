#!/usr/bin/env python3
"""Mutation testing with mutmut, a second yardstick beside ``scripts/mutation.py``.

mutmut (https://github.com/boxed/mutmut) makes a larger and different set of mutants than our
own runner: it also changes string literals (error messages), keyword arguments and call
arguments, and it runs, per mutant, only the tests that call the mutated function (it records
that in a first, clean run). Its configuration is ``[tool.mutmut]`` in pyproject.toml: the same
seven modules and in-process test files as ``scripts/mutation.py``, with the tests that need a
server or Dask workers left out as there.

mutmut is not a project dependency: this script installs it into ``.mutmut-tools/`` (ignored by
git), without the pytest it would bring, so the project's ``.venv`` runs the tests unchanged.
mutmut works in ``mutants/`` (ignored by git); the table goes to
``benchmarks/results/mutmut/mutmut.md``.

Example::

    .venv/bin/python scripts/mutmut_run.py             # install if needed, run, write the table
    .venv/bin/python scripts/mutmut_run.py --table     # only the table, from the last run
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from mutation import MODULES as OURS, limit_memory  # scripts/ is this script's folder

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".mutmut-tools"
OUT = ROOT / "benchmarks" / "results" / "mutmut"
VERSION = "3.8.1"
#: what mutmut's wheel brings that the project's .venv already has, in its own versions
SHADOWING = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py.py")
MODULES = tuple(OURS)


def install() -> None:
    if (TOOLS / "mutmut").is_dir():
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(TOOLS),
                    f"mutmut=={VERSION}"], check=True)
    for path in TOOLS.iterdir():
        if path.name.split("-")[0] in SHADOWING:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def mutmut(*args: str, capture: bool = False) -> str:
    # the in-process tests only, as scripts/mutation.py runs them (tests/conftest.py)
    env = {**os.environ, "PYTHONPATH": str(TOOLS), "COFFEA_SONIC_TESTS_IN_PROCESS": "1"}
    code = "import sys; from mutmut.__main__ import cli; sys.argv[0] = 'mutmut'; cli()"
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, check=True,
                          text=True, stdout=subprocess.PIPE if capture else None,
                          preexec_fn=limit_memory)
    return done.stdout or ""


def module_of(mutant: str) -> str:
    """``coffea_sonic.transport.choice.xǁ...`` -> ``transport.choice``."""
    dotted = mutant.split(".x")[0].removeprefix("coffea_sonic.")
    return next((m for m in MODULES if dotted == m), dotted)


def function_of(mutant: str) -> str:
    """``...routing.xǁRouterǁcontrol__mutmut_3`` -> ``Router.control``; ``...x_f__mutmut_1`` -> ``f``."""
    name = "x" + mutant.split(".x", 1)[1]
    name = name[2:].replace("ǁ", ".") if name.startswith("xǁ") else name[2:]
    return name.rsplit("__mutmut_", 1)[0]


def server_only(mutant: str) -> bool:
    """A mutant in a function that only tests with a server reach (scripts/mutation.py's list)."""
    prefixes = OURS[module_of(mutant)][2]
    return function_of(mutant).startswith(prefixes) if prefixes else False


def table(results: str, command: str, seconds: float | None) -> str:
    counts: dict[str, Counter] = {}
    for line in results.splitlines():
        name, _, status = line.strip().partition(": ")
        if name.startswith("coffea_sonic."):
            status = status.strip()
            if status in ("survived", "no tests") and server_only(name):
                status = "server only"
            counts.setdefault(module_of(name), Counter())[status] += 1
    rows = ["| module | mutants | killed | timeout | survived | no test reaches | survived (only "
            "server tests reach) | not run yet | % killed (killed + timeout of those run and "
            "in-process) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for module in MODULES:
        c = counts.get(module, Counter())
        total = sum(c.values())
        run = total - c["not checked"] - c["server only"]
        caught = c["killed"] + c["timeout"]
        rows.append(f"| {module} | {total} | {c['killed']} | {c['timeout']} | {c['survived']} | "
                    f"{c['no tests']} | {c['server only']} | {c['not checked']} | "
                    f"{100 * caught / run if run else 0:.1f} |")
    took = f"\nWall time: {seconds:.0f} s\n" if seconds is not None else ""
    return f"Command: `{command}` (mutmut {VERSION})\n\n" + "\n".join(rows) + "\n" + took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="only write the last run's table")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="mutants run at once")
    args = parser.parse_args(argv)
    install()
    started = time.monotonic()
    if not args.table:
        mutmut("run", "--max-children", str(args.jobs))
    results = mutmut("results", "--all", "true", capture=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.txt").write_text(results)
    text = table(results, ".venv/bin/python scripts/mutmut_run.py",
                 None if args.table else time.monotonic() - started)
    (OUT / "mutmut.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
