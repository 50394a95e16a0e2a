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
mutmut works in ``mutants/`` (ignored by git). Each module's per-mutant status goes to
``benchmarks/results/mutmut/results-<module>.txt``, headed by the commit and time of its run, so
that a run of some modules keeps the others' results; the table in ``mutmut.md`` is written from
all of those files.

A survivor that no test can tell from the original is listed, with why, in
``scripts/mutmut_equivalent/<module>.toml`` (``"<mutant name>" = "<reason>"``) and counted as
equivalent, not survived; a listed mutant that a test kills counts as killed, and is named on
the output so its entry can go.

Example::

    .venv/bin/python scripts/mutmut_run.py                          # every module
    .venv/bin/python scripts/mutmut_run.py --modules ragged,cache.key -j 1
    .venv/bin/python scripts/mutmut_run.py --table    # only the table, from the results files
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

from mutation import MODULES as OURS, limit_memory  # scripts/ is this script's folder

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".mutmut-tools"
OUT = ROOT / "benchmarks" / "results" / "mutmut"
EQUIVALENT_DIR = ROOT / "scripts" / "mutmut_equivalent"
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


def equivalents(module: str) -> dict[str, str]:
    """The module's survivors shown equivalent: mutant name -> why."""
    path = EQUIVALENT_DIR / f"{module}.toml"
    return tomllib.loads(path.read_text()) if path.exists() else {}


def statuses(results: str) -> dict[str, str]:
    """``mutmut results`` lines (``name: status``) -> name -> status."""
    pairs = (line.strip().partition(": ") for line in results.splitlines())
    return {name: status.strip() for name, _, status in pairs if name.startswith("coffea_sonic.")}


def count(module: str, status_of: dict[str, str], stale: list[str]) -> Counter:
    listed, counts = equivalents(module), Counter()
    for name, status in status_of.items():
        if name in listed and status in ("killed", "timeout"):
            stale.append(name)
        elif status in ("survived", "no tests"):
            status = ("equivalent" if name in listed
                      else "server only" if server_only(name) else status)
        counts[status] += 1
    return counts


HEADER = ("| module | mutants | killed | timeout | survived | equivalent (listed) | no test reaches "
          "| survived (only server tests reach) | not run | % killed = (killed + timeout) / (run "
          "- equivalent), run = in-process and not left unrun | run at |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")


def table() -> tuple[str, list[str]]:
    """The table from every ``results-<module>.txt``, and the listed equivalents now killed."""
    rows, stale = list(HEADER), []
    for module in MODULES:
        path = OUT / f"results-{module}.txt"
        if not path.exists():
            continue
        text = path.read_text()
        c = count(module, statuses(text), stale)
        run = sum(c.values()) - c["not checked"] - c["server only"]
        caught, judged = c["killed"] + c["timeout"], run - c["equivalent"]
        note = text.splitlines()[0].removeprefix("# ") if text.startswith("#") else ""
        rows.append(f"| {module} | {sum(c.values())} | {c['killed']} | {c['timeout']} | "
                    f"{c['survived']} | {c['equivalent']} | {c['no tests']} | "
                    f"{c['server only']} | {c['not checked']} | "
                    f"{100 * caught / judged if judged else 0:.1f} | {note} |")
    return (f"mutmut {VERSION}, `.venv/bin/python scripts/mutmut_run.py --modules ...`; "
            "per-mutant status in results-<module>.txt\n\n" + "\n".join(rows) + "\n"), stale


def run(modules: list[str], jobs: int) -> None:
    """Run mutmut over ``modules`` and write each one's ``results-<module>.txt``."""
    started = time.gmtime()
    mutmut("run", "--max-children", str(jobs), *(f"coffea_sonic.{m}.*" for m in modules))
    status_of = statuses(mutmut("results", "--all", "true", capture=True))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True).stdout.strip()
    when = (time.strftime("%Y-%m-%d %H:%M", started) + time.strftime("-%H:%M UTC", time.gmtime()))
    OUT.mkdir(parents=True, exist_ok=True)
    for module in modules:
        lines = [f"{name}: {s}" for name, s in status_of.items() if module_of(name) == module]
        (OUT / f"results-{module}.txt").write_text(
            f"# {commit}, {when}\n" + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="only write the table")
    parser.add_argument("--modules", default=",".join(MODULES),
                        help=f"comma-separated, of {', '.join(MODULES)} (default: all)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="mutants run at once")
    args = parser.parse_args(argv)
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    unknown = sorted(set(modules) - set(MODULES))
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; known: {', '.join(MODULES)}")
    if not args.table:
        install()
        run(modules, args.jobs)
    text, stale = table()
    (OUT / "mutmut.md").write_text(text)
    sys.stdout.write(text)
    for name in stale:
        sys.stdout.write(f"listed as equivalent but killed (drop its entry): {name}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
