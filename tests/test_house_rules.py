"""The house rules the package's shape must keep (checked on the source, like tests/test_layers.py).

* small modules: at most 500 lines in coffea_sonic/ (data tables excepted);
* small functions: at most 60 lines each, docstring and decorators included;
* glue stays generic: the zoo's column recipes live in the zoo, and a default the glue shares
  with a zoo model is the model's declaration;
* benchmarks live in the package: a Python script under benchmarks/ is a thin caller of a
  ``coffea-sonic bench`` scenario (``run_scenario``) or, for the GPU-only ones, of a
  ``coffea_sonic.bench.gpu`` module's ``main``, unless it is a measurement no user runs, kept
  out of the installed package on purpose (REPOSITORY_ONLY_SCRIPTS); and the GPU scripts open
  with the one shared prologue (benchmarks/gpu/prologue.sh) instead of copies of it.

The lists of exceptions only shrink: an entry that is within the limit again fails the test
until it is removed, so a split stays split.
"""

from __future__ import annotations

import ast
from pathlib import Path

from coffea_sonic import columns
from coffea_sonic.zoo.spec import JET_TAGGER_FEATURES

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "coffea_sonic"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60

#: data tables (declarations, not logic), allowed to be long
DATA_TABLES: set[str] = set()
#: modules over the limit, each with what would split it
LONG_MODULES: dict[str, str] = {}
#: functions over the limit (path::qualified name), each with what would split it
LONG_FUNCTIONS: dict[str, str] = {}

#: longest a thin caller under benchmarks/ may be
THIN_CALLER_LINES = 15
#: scripts under benchmarks/ that still hold logic of their own, each with why it is not a
#: ``coffea-sonic bench`` scenario yet
SCRIPTS_WITH_OWN_LOGIC: dict[str, str] = {}
#: measurements no user runs, whole scripts under benchmarks/ so that the wheel stays light, each
#: with what it measures
REPOSITORY_ONLY_SCRIPTS: dict[str, str] = {
    "benchmarks/agc_bench.py": "the AGC's ML step: local XGBoost, served, the AGC's own client",
    "benchmarks/outage_bench.py": "a run whose server is SIGKILLed mid-run, against a healthy one",
}
#: GPU scripts that still open with their own copy of the prologue (written while their owners
#: ran them on the GPU machines; the next change of each sources prologue.sh)
OWN_PROLOGUE: set[str] = set()


def _sources() -> dict[str, str]:
    return {path.relative_to(PACKAGE).as_posix(): path.read_text()
            for path in sorted(PACKAGE.rglob("*.py"))}


def _long_functions(relative: str, text: str) -> dict[str, int]:
    """``{qualified name: lines}`` of the functions of one module over the limit."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    length = child.end_lineno - start + 1
                    if length > MAX_FUNCTION_LINES:
                        found[f"{relative}::{name}"] = length
                visit(child, f"{name}.")

    visit(ast.parse(text), "")
    return found


def test_modules_are_at_most_500_lines():
    lines = {relative: text.count("\n") for relative, text in _sources().items()}
    over = {relative: count for relative, count in lines.items()
            if count > MAX_MODULE_LINES and relative not in DATA_TABLES}
    assert set(over) <= set(LONG_MODULES), (
        f"modules over {MAX_MODULE_LINES} lines (split them by job): "
        f"{ {k: v for k, v in over.items() if k not in LONG_MODULES} }")
    fixed = sorted(set(LONG_MODULES) - set(over))
    assert not fixed, f"within the limit now: remove from LONG_MODULES: {fixed}"


def test_functions_are_at_most_60_lines():
    over: dict[str, int] = {}
    for relative, text in _sources().items():
        over.update(_long_functions(relative, text))
    new = {name: count for name, count in over.items() if name not in LONG_FUNCTIONS}
    assert not new, f"functions over {MAX_FUNCTION_LINES} lines (docstring included): {new}"
    fixed = sorted(set(LONG_FUNCTIONS) - set(over))
    assert not fixed, f"within the limit now: remove from LONG_FUNCTIONS: {fixed}"


def test_jet_features_default_is_the_jet_taggers_input_order():
    assert columns.DEFAULT_JET_FIELDS == JET_TAGGER_FEATURES


def test_benchmark_scripts_are_thin_callers_of_bench_scenarios():
    scripts = {path.relative_to(ROOT).as_posix(): path.read_text()
               for path in sorted((ROOT / "benchmarks").rglob("*.py"))}
    thin = {name for name, text in scripts.items()
            if ("run_scenario(" in text or "from coffea_sonic.bench.gpu." in text)
            and text.count("\n") <= THIN_CALLER_LINES}
    missing = sorted(set(REPOSITORY_ONLY_SCRIPTS) - set(scripts))
    assert not missing, f"gone now: remove from REPOSITORY_ONLY_SCRIPTS: {missing}"
    own = set(scripts) - thin - set(REPOSITORY_ONLY_SCRIPTS)
    assert own <= set(SCRIPTS_WITH_OWN_LOGIC), (
        f"benchmark scripts with logic of their own (make each a `coffea-sonic bench` scenario "
        f"in coffea_sonic/bench/commands and the script a thin caller): "
        f"{sorted(own - set(SCRIPTS_WITH_OWN_LOGIC))}")
    fixed = sorted(set(SCRIPTS_WITH_OWN_LOGIC) - own)
    assert not fixed, f"thin callers or gone now: remove from SCRIPTS_WITH_OWN_LOGIC: {fixed}"


def test_gpu_scripts_open_with_the_shared_prologue():
    copies = {path.relative_to(ROOT).as_posix() for path in (ROOT / "benchmarks").rglob("*.sh")
              if path.name not in ("prologue.sh", "triton-gpu-env.sh")
              and "source benchmarks/gpu/triton-gpu-env.sh" in path.read_text()}
    assert copies <= OWN_PROLOGUE, (
        f"GPU scripts with their own copy of the opening lines (source "
        f"benchmarks/gpu/prologue.sh instead): {sorted(copies - OWN_PROLOGUE)}")
    fixed = sorted(OWN_PROLOGUE - copies)
    assert not fixed, f"prologue.sh sourced now: remove from OWN_PROLOGUE: {fixed}"
