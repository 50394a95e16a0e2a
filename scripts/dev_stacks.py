"""``python3 dev.py test``'s runs beside other users' stacks (standard library only).

Besides the development venv, coffea-sonic's core (the client) is installed into venvs that first
get a user's stack from the package index, and the client-level suites run there against a server
from the server's own environment (``COFFEA_SONIC_SERVER_ENV``: the development venv, which has
nvidia-pytriton and numpy < 2):

* ``newest``: the newest coffea[dask-awkward], dask, distributed, dask-awkward, awkward and numpy 2
  that pip resolves that day (printed). ``coffea[dask-awkward]`` rather than a bare coffea: a bare
  ``coffea dask distributed dask-awkward`` resolved dask 2026.8 with dask-awkward 2025.3.0 on
  2026-11-26, a pair whose axis-0 reductions and graph optimisation fail without coffea-sonic.
* ``oldest``: the oldest supported coffea (2025.7.0) with dask and distributed, and the oldest
  supported tritonclient (2.58.0) installed with the core; the model, routing, processor and
  bad-input suites run there.

The core is installed from the wheel ``pip wheel .`` builds from this checkout (built once per run),
as a user installs a built wheel: so the stack runs also prove that the wheel installs into a clean
venv beside coffea. Installing it must change none of coffea, numpy, awkward, dask, distributed,
uproot (``pip freeze`` before and after). A venv is reused the same day (the stack is resolved once
a day); a reused venv gets this run's wheel again (``--no-deps --force-reinstall``).
``DEV_STACKS=main`` (or ``main,oldest``...) picks the runs; test files given on the command line
select the suites of each run (a run none of whose suites is selected is left out).

A full run (no test paths, no ``-k``/``-m`` or other option that selects a part or runs nothing)
fails when a run collects no test (pytest's exit 5) or passes fewer tests than its minimum
(:data:`MIN_PASSED`): a suite that silently stopped collecting, or a stack that stopped running
suites, is a failure rather than a shorter green run. The main run lists its 25 slowest tests.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from collections import deque
from pathlib import Path

CLIENT_SUITES = ("tests/test_processor.py", "tests/test_bad_inputs.py", "tests/test_faults.py",
                 "tests/test_routing.py", "tests/test_wrong_answers.py", "tests/test_ragged.py")
#: name -> (the user's stack, what is installed with the core, suites)
STACKS = {
    "newest": (["coffea[dask-awkward]", "dask", "distributed", "dask-awkward", "numpy>=2"], [],
               CLIENT_SUITES),
    "oldest": (["coffea==2025.7.0", "dask", "distributed"], ["tritonclient[grpc]==2.58.0"],
               ("tests/test_model.py", "tests/test_routing.py", "tests/test_processor.py",
                "tests/test_bad_inputs.py")),
}
#: The fewest tests each run of a full run must pass: a little under what they pass now (main
#: 1125, newest 146, oldest 102), so that a few tests skipped on another machine do not fail it,
#: while a suite that stopped being collected or a stack left without suites does.
MIN_PASSED = {"main": 1050, "newest": 135, "oldest": 95}
#: Options that run a part of the suites (or none): a run with one is not a full run.
SELECTING = ("-k", "-m", "--lf", "--last-failed", "--sw", "--stepwise", "--deselect",
             "--co", "--collect-only", "--setup-plan", "--fixtures")
#: Options whose value is the next argument (a ``-k`` expression is not a test path).
TAKES_VALUE = ("-k", "-m", "-p", "-c", "-o", "-W", "-n", "--deselect", "--ignore",
               "--ignore-glob", "--timeout", "--durations", "--maxfail", "--rootdir",
               "--basetemp", "--confcutdir")
UNCHANGED = ("coffea", "numpy", "awkward", "dask", "distributed", "uproot")
SHOWN = UNCHANGED + ("dask-awkward", "dask-histogram", "pyarrow", "tritonclient", "protobuf",
                     "grpcio")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")


def _pip(python: Path, *args: str) -> None:
    # --no-compile: byte-compiling every module of the stack costs minutes of CPU on 2 cores;
    # the tests import (and so compile) a small part of it
    if args and args[0] == "install":
        args = ("install", "--no-compile", *args[1:])
    result = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args)} failed:\n{result.stdout[-3000:]}"
                           f"{result.stderr[-3000:]}")


def _freeze(python: Path) -> dict[str, str]:
    listing = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "freeze"],
                             capture_output=True, text=True, check=True).stdout
    versions = {}
    for line in listing.splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            versions[re.sub(r"[-_.]+", "-", name).lower()] = version
    return versions


def core_wheel(root: Path, python: Path, folder: Path) -> Path:
    """The wheel ``pip wheel .`` builds from ``root``'s files as a fresh clone has them (tracked,
    and new files git does not ignore), with build isolation as a user's pip does, written into
    ``folder``. A copy, because setuptools' in-tree build/lib keeps modules deleted since."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=root, check=True, capture_output=True, text=True).stdout
    clone = folder / "clone"
    for relative in listed.splitlines():
        if (root / relative).is_file():
            (clone / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / relative, clone / relative)
    _pip(python, "wheel", "--no-deps", "--quiet", "-w", str(folder), str(clone))
    wheels = sorted(folder.glob("coffea_sonic-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"pip wheel {root} made {[w.name for w in wheels]}, not one wheel")
    return wheels[0]


def build(root: Path, name: str, wheel: Path) -> Path:
    """The venv of stack ``name`` with coffea-sonic's core (``wheel``) in it; raise if the core
    moved the stack."""
    stack, with_core, _ = STACKS[name]
    prefix = root / f".venv-{name}"
    python = prefix / "bin" / "python"
    key = hashlib.sha256(f"{datetime.date.today()} {stack} {with_core}".encode()
                         + (root / "pyproject.toml").read_bytes()).hexdigest()
    stamp = prefix / ".coffea-sonic-stack"
    if python.exists() and stamp.exists() and stamp.read_text() == key:
        print(f"[{name}] reusing {prefix} (resolved today); installing {wheel.name}", flush=True)
        _pip(python, "install", "--quiet", "--no-deps", "--force-reinstall", str(wheel))
        return python
    shutil.rmtree(prefix, ignore_errors=True)
    print(f"[{name}] creating {prefix}: pip install {' '.join(stack)}", flush=True)
    venv.EnvBuilder(with_pip=True).create(prefix)
    _pip(python, "install", "--quiet", *stack)
    before = _freeze(python)
    _pip(python, "install", "--quiet", str(wheel), *with_core)  # the core: no extras
    after = _freeze(python)
    print(f"[{name}] resolved: " + ", ".join(f"{p}=={after.get(p, '-')}" for p in SHOWN), flush=True)
    moved = [f"{p} {before.get(p)} -> {after.get(p)}" for p in UNCHANGED
             if before.get(p) != after.get(p)]
    if moved:
        raise RuntimeError(f"[{name}] installing coffea-sonic's core changed {', '.join(moved)}")
    print(f"[{name}] installing coffea-sonic's core changed none of {', '.join(UNCHANGED)}",
          flush=True)
    _pip(python, "install", "--quiet", "pytest>=8", "pytest-timeout>=2.3")
    stamp.write_text(key)
    return python


def run_pytest(python: Path, args: list[str], cwd: Path, env: dict[str, str],
               label: str) -> tuple[int, dict[str, int]]:
    """Run pytest, showing its output; return its exit code and its closing counts."""
    print(f"[{label}] {python} -m pytest {' '.join(args)}", flush=True)
    process = subprocess.Popen([str(python), "-m", "pytest", *args], cwd=cwd, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: deque[str] = deque(maxlen=40)
    for line in process.stdout:
        sys.stdout.write(line)
        tail.append(line)
    code = process.wait()
    counts: dict[str, int] = {}
    for line in reversed(tail):
        if re.search(r"\bin [\d.]+s\b", line) and _COUNT.search(line):
            for number, kind in _COUNT.findall(line):
                kind = "errors" if kind.startswith("error") else kind
                counts[kind] = counts.get(kind, 0) + int(number)
            break
    return code, counts


def _split(root: Path, args: list[str]) -> tuple[list[str], list[str]]:
    """(options, test paths) of a pytest command line; an option's value stays an option."""
    options, paths = [], []
    value_next = False
    for arg in args:
        if value_next or arg.startswith("-") or not (root / arg.split("::")[0]).exists():
            options.append(arg)
        else:
            paths.append(arg)
        value_next = arg in TAKES_VALUE
    return options, paths


def _is_full(options: list[str], paths: list[str]) -> bool:
    """Whether a command line runs every test: no paths, and no option that selects a part."""
    return not paths and not any(
        option == name or option.startswith(name + "=") or (len(name) == 2 and
                                                             option.startswith(name))
        for option in options for name in SELECTING)


def _main_arguments(args: list[str]) -> list[str]:
    """The main run's pytest arguments: the command line's, listing the 25 slowest tests."""
    if any(arg.startswith("--durations") for arg in args):
        return list(args)
    return ["--durations=25", *args]


#: ``dev.py test --fast``: the edit loop's tier (about 80 s on the 2-core box): the house rules,
#: the doctests, settings and API, and the client's suites against one real server
FAST_SUITES = ("tests/test_doctests.py", "tests/test_layers.py", "tests/test_house_rules.py",
               "tests/test_public_api.py", "tests/test_settings.py", "tests/test_transport.py",
               "tests/test_routing.py", "tests/test_ragged.py", "tests/test_client_options.py",
               "tests/test_dev_stacks.py", "tests/test_model.py", "tests/test_client_policy.py",
               "tests/test_cli_shape.py", "tests/test_columns.py", "tests/test_sizing.py",
               "tests/test_process_local.py", "tests/test_config_digest.py",
               "tests/test_bad_inputs.py")


def fast_arguments(args: list[str]) -> list[str] | None:
    """The pytest arguments of ``--fast`` (its suites unless paths are given), None without it.

    >>> fast_arguments(["-x"]) is None, fast_arguments(["--fast", "-x"])[:2]
    (True, ['-x', 'tests/test_doctests.py'])
    """
    if "--fast" not in args:
        return None
    rest = [arg for arg in args if arg != "--fast"]
    has_paths = any(not arg.startswith("-") and arg.startswith("tests") for arg in rest)
    return rest if has_paths else [*rest, *FAST_SUITES]


def run_all(root: Path, python: Path, args: list[str], env: dict[str, str]) -> int:
    """The development venv's run, then each stack's; one exit code and one closing line.
    ``--fast``: the development venv's fast tier alone (:data:`FAST_SUITES`)."""
    fast = fast_arguments(args)
    if fast is not None:
        started = time.monotonic()
        code, counts = run_pytest(python, fast, root, env, "fast")
        return _report([("fast", code, counts, f"tests {time.monotonic() - started:.0f} s")],
                       full=False)
    wanted = os.environ.get("DEV_STACKS", "main," + ",".join(STACKS)).split(",")
    options, paths = _split(root, args)
    results = []
    if "main" in wanted:
        started = time.monotonic()
        results.append(("main", *run_pytest(python, _main_arguments(args), root, env, "main"),
                        f"tests {time.monotonic() - started:.0f} s"))
    wheels = Path(tempfile.mkdtemp(prefix="coffea-sonic-wheel-"))
    wheel: Path | None = None
    for name, (_, _, suites) in STACKS.items():
        selected = [p for p in paths if p.split("::")[0] in suites] if paths else list(suites)
        if name not in wanted or not selected:
            continue
        started = time.monotonic()
        try:
            wheel = wheel or core_wheel(root, python, wheels)
            stack_python = build(root, name, wheel)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as error:
            print(error, flush=True)
            results.append((name, 1, {"failed": 1}, "venv failed"))
            continue
        built = time.monotonic()
        stack_env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        stack_env["PATH"] = f"{stack_python.parent}{os.pathsep}{os.environ.get('PATH', '')}"
        stack_env.setdefault("COFFEA_SONIC_SERVER_ENV", str(python.parent.parent))
        outcome = run_pytest(stack_python, [*options, *selected], root, stack_env, name)
        results.append((name, *outcome, f"venv {built - started:.0f} s, tests "
                                        f"{time.monotonic() - built:.0f} s"))
    shutil.rmtree(wheels, ignore_errors=True)
    return _report(results, full=_is_full(options, paths))


def _report(results: list[tuple[str, int, dict[str, int], str]], *, full: bool) -> int:
    """Print each run's line and the total; return the exit code of the whole (module docstring:
    on a full run, no test collected or fewer passed than :data:`MIN_PASSED` fail)."""
    total: dict[str, int] = {}
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    for name, code, counts, took in results:
        print(f"[{name}] exit {code}: " + ", ".join(f"{v} {k}" for k, v in counts.items())
              + f" ({took}; load now {load})")
        for kind, number in counts.items():
            total[kind] = total.get(kind, 0) + number
    failed = total.get("failed", 0) + total.get("errors", 0)
    print(f"total: {total.get('passed', 0)} passed, {failed} failed, "
          f"{total.get('skipped', 0)} skipped", flush=True)
    codes = [code for _, code, _, _ in results]
    bad = [code for code in codes if code not in (0, 5)]
    if bad:
        return bad[0]
    if full:
        empty = [name for name, code, _, _ in results if code == 5]
        short = [f"{name} passed {counts.get('passed', 0)} < {MIN_PASSED[name]}"
                 for name, _, counts, _ in results
                 if name in MIN_PASSED and counts.get("passed", 0) < MIN_PASSED[name]]
        if empty:
            print(f"FAILED: a full run collected no test in {', '.join(empty)}", flush=True)
            return 5
        if short:
            print(f"FAILED: fewer tests passed than a full run passes: {'; '.join(short)}",
                  flush=True)
            return 1
    return 5 if codes and all(code == 5 for code in codes) else 0
