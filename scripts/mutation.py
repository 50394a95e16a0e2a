#!/usr/bin/env python3
"""Mutation testing of the modules whose mistakes a user would not notice.

Each mutant is one small change to one module's syntax tree (a comparison flipped, ``and`` for
``or``, a number off by one, ``not`` dropped, a return value replaced by ``None``, ...). The
in-process tests that cover the module then run against it; a mutant they fail on is *killed*.
Survivors fall in three groups:

* ``equivalent``: listed in ``scripts/mutation_equivalent.toml`` with why no test can tell it
  from the original;
* ``not_reached``: its statement never runs under the in-process tests (or it is listed under
  ``[[server_only]]`` in that file); only tests that need a Triton server or Dask workers reach
  it, and those run the code in other processes that never see the mutant, so such a survivor is
  reported apart, never counted as killed;
* ``survived``: a test is missing.

How it runs: the tool is this file, which needs nothing beyond the project's own ``.venv``
(pytest, pytest-timeout); nothing is installed. The parent process imports pytest and the heavy
third-party libraries once, then forks one child per mutant; the child puts an import hook in
front of ``sys.path`` that serves the mutated code for the one module, and runs
``pytest -x -q -p no:cacheprovider`` on the module's test files, leaving out the tests that use a
server fixture. Nothing in the checkout is written except the results.

Example::

    .venv/bin/python scripts/mutation.py                       # every module, 2 workers
    .venv/bin/python scripts/mutation.py --modules ragged,retry -j 1
    .venv/bin/python scripts/mutation.py --list ragged          # the mutants, without running
"""
from __future__ import annotations

import argparse
import ast
import importlib.abc
import importlib.util
import json
import os
import resource
import signal
import sys
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT_FILE = ROOT / "scripts" / "mutation_equivalent.toml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "mutation"

#: module key -> (dotted name, test files, qualname prefixes left out: they talk to a server)
MODULES: dict[str, tuple[str, list[str], tuple[str, ...]]] = {
    "validation": ("coffea_sonic.validation",
                   ["tests/test_validation_edges.py", "tests/test_validation_mutants.py",
                    "tests/test_client_options.py",
                    "tests/test_sizing.py", "tests/test_transport.py"], ()),
    "ragged": ("coffea_sonic.ragged", ["tests/test_ragged_edges.py",
                                        "tests/test_ragged_mutants.py", "tests/test_ragged.py"], ()),
    "cache.key": ("coffea_sonic.cache.key",
                  ["tests/test_cache_key_edges.py", "tests/test_cache_key_mutants.py",
                   "tests/test_inference_cache.py"], ()),
    "retry": ("coffea_sonic.retry", ["tests/test_retry_edges.py", "tests/test_retry_mutants.py",
                                  "tests/test_client_policy.py"], ()),
    "answers": ("coffea_sonic.answers",
                ["tests/test_answers_edges.py", "tests/test_client_policy.py"], ()),
    "transport.choice": ("coffea_sonic.transport.choice",
                         ["tests/test_transport_choice_edges.py", "tests/test_cuda_choice.py",
                          "tests/test_transport.py"], ()),
    "routing": ("coffea_sonic.routing",
                ["tests/test_routing_edges.py", "tests/test_routing_mutants.py",
                 "tests/test_routing.py"],
                ("Router.control", "Router.data_transport", "Router.model_info",
                 "Router._ensure_health_thread", "Router._health_loop", "Router._probe")),
}


_COMPARE = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.LtE, ast.LtE: ast.Lt,
            ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
            ast.In: ast.NotIn, ast.NotIn: ast.In}
_BINARY = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
           ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
_SYMBOL = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
           ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+",
           ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**", ast.And: "and", ast.Or: "or"}
_LOGGERS = {"log", "logger", "_log", "LOG", "_logger"}


@dataclass
class Mutant:
    module: str
    index: int
    line: int
    where: str
    source: str
    mutation: str
    #: first line of the statement holding the mutant (what the line tracer sees run)
    statement_line: int = 0
    status: str = ""
    reason: str = ""


def _skipped_nodes(tree: ast.Module) -> set[int]:
    """Ids of nodes no mutant should touch: docstrings, annotations, ``__all__``, log calls."""
    skip: set[int] = set()

    def drop(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                drop(body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            drop(node.returns)
            for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                drop(arg.annotation)
        if isinstance(node, ast.AnnAssign):
            drop(node.annotation)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            drop(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            drop(node)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in _LOGGERS):
            drop(node)
    return skip


def _qualnames(tree: ast.Module) -> dict[int, str]:
    names: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{child.name}" if prefix else child.name
                for sub in ast.walk(child):
                    names[id(sub)] = name
                visit(child, name)
            else:
                visit(child, prefix)
    visit(tree, "")
    return names


def _points(tree: ast.Module) -> list[tuple[int, ast.AST, str]]:
    """(walk order, node, mutation) for every mutation point, in a fixed order."""
    skip = _skipped_nodes(tree)
    found: list[tuple[int, ast.AST, str]] = []
    for order, node in enumerate(ast.walk(tree)):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for k, op in enumerate(node.ops):
                if type(op) in _COMPARE:
                    found.append((order, node, f"cmp{k}:{_SYMBOL[type(op)]} -> "
                                                f"{_SYMBOL[_COMPARE[type(op)]]}"))
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINARY:
            found.append((order, node, f"{_SYMBOL[type(node.op)]} -> "
                                       f"{_SYMBOL[_BINARY[type(node.op)]]}"))
        elif isinstance(node, ast.BoolOp):
            found.append((order, node, "and -> or" if isinstance(node.op, ast.And) else "or -> and"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            found.append((order, node, "not x -> x"))
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            found.append((order, node, f"{node.value} -> {not node.value}"))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
            found.append((order, node, f"{node.value!r} -> {node.value + 1!r}"))
        elif (isinstance(node, ast.Return) and node.value is not None
              and not (isinstance(node.value, ast.Constant) and node.value.value is None)):
            found.append((order, node, "return x -> return None"))
    return found


class _Unnot(ast.NodeTransformer):
    def __init__(self, target: ast.AST):
        self.target = target

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        return node.operand if node is self.target else node


def mutated_code(path: Path, index: int):
    """The code object of ``path`` with mutant ``index`` applied."""
    tree = ast.parse(path.read_text(), filename=str(path))
    order, node, mutation = _points(tree)[index]
    if mutation.startswith("cmp"):
        k = int(mutation[3:mutation.index(":")])
        node.ops[k] = _COMPARE[type(node.ops[k])]()
    elif isinstance(node, (ast.BinOp, ast.AugAssign)):
        node.op = _BINARY[type(node.op)]()
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.UnaryOp):
        tree = _Unnot(node).visit(tree)
    elif isinstance(node, ast.Constant):
        node.value = (not node.value) if type(node.value) is bool else node.value + 1
    elif isinstance(node, ast.Return):
        node.value = ast.Constant(None)
    ast.fix_missing_locations(tree)
    return compile(tree, str(path), "exec")


def list_mutants(key: str) -> list[Mutant]:
    dotted, _tests, left_out = MODULES[key]
    path = module_path(dotted)
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    names = _qualnames(tree)
    statement_of: dict[int, int] = {}
    for statement in ast.walk(tree):
        if isinstance(statement, ast.stmt):
            for sub in ast.walk(statement):
                statement_of.setdefault(id(sub), statement.lineno)
    for statement in sorted((n for n in ast.walk(tree) if isinstance(n, ast.stmt)),
                            key=lambda n: n.lineno):
        for sub in ast.walk(statement):  # the innermost statement wins
            statement_of[id(sub)] = statement.lineno
    mutants = []
    for index, (_order, node, mutation) in enumerate(_points(tree)):
        where = names.get(id(node), "<module>")
        if any(where == p or where.startswith(p + ".") for p in left_out):
            continue
        mutants.append(Mutant(key, index, node.lineno, where, lines[node.lineno - 1].strip(),
                              mutation, statement_of.get(id(node), node.lineno)))
    return mutants


def module_path(dotted: str) -> Path:
    return ROOT / (dotted.replace(".", "/") + ".py")


class _MutantFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, dotted: str, path: Path, code):
        self.dotted, self.path, self.code = dotted, path, code

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.dotted:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path, loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(self.code, module.__dict__)


#: the most memory a mutant's test run may take: a mutant that turns a size into a huge one
#: fails with MemoryError (killed) instead of making the kernel kill other processes on the box
MEMORY_LIMIT = 4 * 2**30


def limit_memory(limit: int = MEMORY_LIMIT) -> None:
    """Cap this process' data segment (heap and private mappings) at ``limit`` bytes."""
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _child(key: str, index: int | None, trace_file: str | None, quiet: bool) -> int:
    dotted, tests, _ = MODULES[key]
    limit_memory()
    path = module_path(dotted)
    if index is not None:
        sys.meta_path.insert(0, _MutantFinder(dotted, path, mutated_code(path, index)))
    if quiet:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    lines: set[int] = set()
    if trace_file:
        target = str(path)

        def tracer(frame, event, arg):
            if frame.f_code.co_filename != target:
                return None

            def local(frame, event, arg):
                if event == "line":
                    lines.add(frame.f_lineno)
                return local
            lines.add(frame.f_lineno)
            return local
        sys.settrace(tracer)
        import threading
        threading.settrace(tracer)
    import pytest

    os.environ["COFFEA_SONIC_TESTS_IN_PROCESS"] = "1"  # tests/conftest.py: no server tests
    rc = pytest.main([*[t for t in tests if (ROOT / t).exists()], "-x", "-q",
                      "-p", "no:cacheprovider", "--timeout=120"])
    if trace_file:
        sys.settrace(None)
        Path(trace_file).write_text(json.dumps(sorted(lines)))
    return int(rc)


def _fork(key: str, index: int | None, trace_file: str | None = None, quiet: bool = True) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            code = _child(key, index, trace_file, quiet)
        except BaseException:
            code = 3
        os._exit(code)
    return pid


def _wait_all(running: dict[int, tuple[Mutant, float]], limit_s: float, block: bool) -> list[tuple[Mutant, int]]:
    done = []
    while running:
        for pid, (mutant, started) in list(running.items()):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                del running[pid]
                done.append((mutant, os.waitstatus_to_exitcode(status)))
            elif time.monotonic() - started > limit_s:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                del running[pid]
                done.append((mutant, -999))
        if done or not block:
            return done
        time.sleep(0.05)
    return done


def load_equivalent() -> dict[tuple[str, str, str, str], tuple[str, str]]:
    """(module, where, source line, mutation) -> (status, reason) from EQUIVALENT_FILE:
    ``[[equivalent]]`` entries (no test can tell them apart) and ``[[server_only]]`` entries
    (only a test with a real server could kill them: reported apart, not counted as killed)."""
    if not EQUIVALENT_FILE.exists():
        return {}
    data = tomllib.loads(EQUIVALENT_FILE.read_text())
    return {(e["module"], e["where"], e["source"], e["mutation"]): (status, e["reason"])
            for table, status in (("equivalent", "equivalent"), ("server_only", "not_reached"))
            for e in data.get(table, [])}


def run_module(key: str, jobs: int, equivalent: dict) -> list[Mutant]:
    mutants = list_mutants(key)
    trace = f"/tmp/mutation-trace-{os.getpid()}-{key}.json"
    started = time.monotonic()
    pid = _fork(key, None, trace)
    _, status = os.waitpid(pid, 0)
    baseline_s = time.monotonic() - started
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        raise SystemExit(f"{key}: the tests fail (exit {rc}) without any mutant; run "
                         f"`.venv/bin/python -m pytest -x -q {' '.join(MODULES[key][1])}` to see why")
    reached = set(json.loads(Path(trace).read_text()))
    Path(trace).unlink()
    limit_s = max(60.0, 10 * baseline_s)
    print(f"{key}: {len(mutants)} mutants, tests take {baseline_s:.1f} s", flush=True)
    running: dict[int, tuple[Mutant, float]] = {}
    queue = list(mutants)
    while queue or running:
        while queue and len(running) < jobs:
            mutant = queue.pop(0)
            running[_fork(key, mutant.index)] = (mutant, time.monotonic())
        for mutant, code in _wait_all(running, limit_s, block=True):
            if code == -999:
                mutant.status, mutant.reason = "killed", "timed out"
            elif code == 0:
                listed = equivalent.get((key, mutant.where, mutant.source, mutant.mutation))
                if listed:
                    mutant.status, mutant.reason = listed
                elif mutant.statement_line not in reached:
                    mutant.status = "not_reached"
                    mutant.reason = "line not run in-process; only server/Dask tests reach it"
                else:
                    mutant.status = "survived"
            elif code == 5:
                mutant.status, mutant.reason = "error", "no tests ran"
            else:
                mutant.status = "killed"
    return mutants


def summarize(results: list[Mutant]) -> list[dict]:
    rows = []
    for key in dict.fromkeys(m.module for m in results):
        ms = [m for m in results if m.module == key]
        count = {s: sum(m.status == s for m in ms) for s in
                 ("killed", "survived", "not_reached", "equivalent", "error")}
        judged = len(ms) - count["equivalent"]
        rows.append({"module": key, "mutants": len(ms), **count,
                     "killed_pct": round(100 * count["killed"] / judged, 1) if judged else 100.0})
    return rows


def markdown(rows: list[dict], results: list[Mutant], command: str) -> str:
    out = [f"Command: `{command}`", "",
           "| module | mutants | killed | survived (in-process) | survived (only server/Dask "
           "tests reach) | equivalent | % killed (of non-equivalent) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['module']} | {r['mutants']} | {r['killed']} | {r['survived']} | "
                   f"{r['not_reached']} | {r['equivalent']} | {r['killed_pct']} |")
    left = [m for m in results if m.status in ("survived", "not_reached", "error")]
    if left:
        out += ["", "Survivors:", ""]
        out += [f"- {m.module}:{m.line} `{m.where}` `{m.source}` ({m.mutation}): {m.status}"
                + (f" ({m.reason})" if m.reason else "") for m in left]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Uses the project's .venv as it is; installs nothing.")
    parser.add_argument("--modules", default=",".join(MODULES),
                        help=f"comma-separated, from: {', '.join(MODULES)}")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="mutants run at once")
    parser.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    parser.add_argument("--update", action="store_true",
                        help="keep the other modules' results of the last run in --out")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.modules.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODULES]
    if unknown:
        parser.error(f"unknown modules {unknown}; choose from {', '.join(MODULES)}")
    if args.list:
        for key in keys:
            for m in list_mutants(key):
                print(f"{key}:{m.line} #{m.index} {m.where}: {m.source} ({m.mutation})")
        return 0
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    import numpy  # noqa: F401  imported once here so each forked child starts warm
    import pytest  # noqa: F401
    equivalent = load_equivalent()
    started = time.monotonic()
    results: list[Mutant] = []
    for key in keys:
        results += run_module(key, args.jobs, equivalent)
    command = ".venv/bin/python scripts/mutation.py" + ("" if argv is None and len(sys.argv) == 1
                                                        else " " + " ".join(sys.argv[1:]))
    if args.update and (args.out / "mutation.json").exists():
        last = json.loads((args.out / "mutation.json").read_text())
        kept = [Mutant(**m) for m in last["mutants"] if m["module"] not in keys]
        results = sorted(kept + results, key=lambda m: list(MODULES).index(m.module))
        command = f"{last['command']}`, then `{command}"
    rows = summarize(results)
    text = markdown(rows, results, command) + f"\nWall time: {time.monotonic() - started:.0f} s\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mutation.md").write_text(text)
    (args.out / "mutation.json").write_text(json.dumps(
        {"command": command, "modules": rows, "mutants": [asdict(m) for m in results]}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
