"""Every docstring example in the coffea_sonic package runs as a test: one item per docstring.

Why a test module instead of ``--doctest-modules``: pytest's collector imports each module itself,
so a module whose optional dependency is missing is either a collection error or, with
``--doctest-ignore-import-errors``, silently dropped. Here the reason is explicit: a module that
cannot be imported for lack of an optional extra, and a docstring listed in :data:`NEEDS` whose
requirement (torch, a CUDA GPU) this machine lacks, are reported as *skipped* with that reason;
any other import error fails. Examples marked ``# doctest: +SKIP`` in the source (they need a
network download, a server on a fixed port or a long run) are the only ones not executed.
"""

from __future__ import annotations

import doctest
import os
import functools
import importlib
import importlib.util
import pkgutil
import traceback
from dataclasses import dataclass
from typing import Callable

import pytest

import coffea_sonic
import zoo_training

#: Top-level modules of the package's optional extras (pyproject.toml): without them the modules
#: that need them are skipped, not failed. Anything else that does not import is a failure.
OPTIONAL_MODULES = {"torch", "dask_jobqueue", "pytriton"}
#: pytest's default for doctests: ``...`` matches anything (addresses, timings, object ids).
OPTION_FLAGS = doctest.ELLIPSIS


@functools.cache
def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@functools.cache
def _has_cuda() -> bool:
    if not _has("torch"):
        return False
    import torch

    return torch.cuda.is_available()


@dataclass(frozen=True)
class Need:
    """What a docstring's examples need beyond the base install, and how to tell it is here."""

    what: str
    present: Callable[[], bool]


TORCH = Need("torch (the 'torch' extra)", lambda: _has("torch"))
CUDA_GPU = Need("torch with a CUDA GPU", _has_cuda)
SERVER = Need("the tritonserver binary (the 'server' extra)", lambda: _has("pytriton"))

#: Docstrings (by doctest name, or a module name for all of its docstrings) whose examples need
#: something optional. Checked when the test runs, so a GPU machine runs them.
NEEDS: dict[str, Need] = {
    "coffea_sonic.zoo.torch_models": TORCH,
    "coffea_sonic.zoo.trackgnn.pipeline": TORCH,
    "coffea_sonic.zoo.trackgnn.run_direct": TORCH,
    "zoo_training.train.train_jet_tagger": TORCH,
    "zoo_training.trackgnn_train": TORCH,
    "zoo_training.physics": TORCH,
    "coffea_sonic.engines.GpuEngine": CUDA_GPU,
    "coffea_sonic.server.launcher": SERVER,
}


@dataclass(frozen=True)
class Case:
    """One test: a module's docstring, or a module that could not be imported."""

    name: str
    test: doctest.DocTest | None = None
    skip_reason: str | None = None
    import_error: str | None = None


def _module_names() -> list[str]:
    # A subpackage that fails to import is still listed (walk_packages yields it before importing
    # it to look inside); _cases then reports its import error as a failing case.
    # the zoo's training (scripts/zoo_training, outside the package) keeps its examples checked
    return [name for package in (coffea_sonic, zoo_training) for name in [package.__name__] + [
        info.name for info in pkgutil.walk_packages(
            package.__path__, f"{package.__name__}.", onerror=lambda name: None)]]


def _cases() -> list[Case]:
    cases: list[Case] = []
    finder = doctest.DocTestFinder(exclude_empty=True)
    for name in _module_names():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name and error.name.split(".")[0] in OPTIONAL_MODULES:
                cases.append(Case(name, skip_reason=f"{name} needs the optional {error.name!r}"))
            else:
                cases.append(Case(name, import_error=traceback.format_exc()))
            continue
        except Exception:  # noqa: BLE001 (reported as this module's failing case)
            cases.append(Case(name, import_error=traceback.format_exc()))
            continue
        for test in finder.find(module, name):
            if test.examples:
                cases.append(Case(test.name, test=test))
    return sorted(cases, key=lambda case: case.name)


def _need_of(name: str) -> Need | None:
    """The requirement of docstring ``name``: its own entry, else its enclosing module's."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        need = NEEDS.get(".".join(parts[:end]))
        if need is not None:
            return need
    return None


CASES = _cases()

#: Docstrings whose examples do not check anything yet, in modules other work is changing right
#: now: each says what is missing. An entry whose docstring gets a checked example must go (the
#: test below fails on it), so the list only shrinks.
UNCHECKED: dict[str, str] = {}


def _what_is_unchecked(test: doctest.DocTest) -> str:
    """Why ``test``'s examples check nothing ("" when they do): none runs (all ``+SKIP``), or
    none that runs has an expected output (so only 'raises nothing' is checked)."""
    run = [example for example in test.examples
           if not example.options.get(doctest.SKIP, False)]
    if not run:
        return f"none of its {len(test.examples)} examples runs (all +SKIP)"
    if not any(example.want.strip() for example in run):
        return f"none of its {len(run)} examples that run has an expected output"
    return ""


def test_every_requirement_entry_names_a_collected_docstring():
    """A renamed function must not turn its GPU/torch examples into silently unchecked ones."""
    names = [case.name for case in CASES]
    stale = [key for key in NEEDS if not any(n == key or n.startswith(key + ".") for n in names)]
    assert not stale, f"NEEDS lists docstrings that no longer exist: {stale}"


def test_every_docstring_with_examples_runs_one_with_an_expected_output():
    """An example that is never run, or whose output nobody states, passes whatever the code
    does: every collected docstring must run at least one example and compare an output (a
    value or an exception). Doctest itself fails an example that prints what it does not state."""
    found = {case.name: _what_is_unchecked(case.test) for case in CASES if case.test is not None}
    unchecked = {name: why for name, why in found.items() if why and name not in UNCHECKED}
    assert not unchecked, ("docstring examples that check nothing (give each a run example "
                           f"with its expected output, or remove it): {unchecked}")
    stale = [name for name in UNCHECKED if not found.get(name)]
    assert not stale, f"remove from UNCHECKED (now checked, or gone): {stale}"


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_docstring_examples(case: Case) -> None:
    if case.import_error is not None:
        pytest.fail(f"{case.name} does not import:\n{case.import_error}", pytrace=False)
    if case.skip_reason is not None:
        pytest.skip(case.skip_reason)
    need = _need_of(case.name)
    if need is not None and not need.present():
        pytest.skip(f"{case.name} needs {need.what}, which this machine lacks")
    runner = doctest.DocTestRunner(optionflags=OPTION_FLAGS)
    report: list[str] = []
    # examples that set settings in os.environ (and clean up only when they all pass) must not
    # leak them into later tests: every variable is restored when this test ends
    snapshot = dict(os.environ)
    # The finder gave each docstring its own copy of the module's globals; run() clears it after.
    try:
        result = runner.run(case.test, out=report.append)
    finally:
        os.environ.clear()
        os.environ.update(snapshot)
    if result.failed:
        pytest.fail(f"{result.failed} of {result.attempted} examples failed in {case.name}:\n"
                    + "".join(report), pytrace=False)
