"""The house rules the package's shape must keep (checked on the source, like tests/test_layers.py).

* small modules: at most 500 lines in coffea_sonic/ (data tables excepted);
* small functions: at most 60 lines each, docstring and decorators included;
* glue stays generic: the zoo's column recipes live in the zoo, and a default the glue shares
  with a zoo model is the model's declaration.

The lists of exceptions only shrink: an entry that is within the limit again fails the test
until it is removed, so a split stays split.
"""

from __future__ import annotations

import ast
from pathlib import Path

from coffea_sonic import columns
from coffea_sonic.zoo.spec import JET_TAGGER_FEATURES

PACKAGE = Path(__file__).resolve().parents[1] / "coffea_sonic"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60

#: data tables (declarations, not logic), allowed to be long
DATA_TABLES: set[str] = set()
#: modules over the limit, each with what would split it
LONG_MODULES: dict[str, str] = {}
#: functions over the limit (path::qualified name), each with what would split it
LONG_FUNCTIONS: dict[str, str] = {}


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
