"""scripts/dev_stacks.py's verdict (what ``python3 dev.py test``, and so CI, exits with), on the
results its runs would report: a full run that collected nothing, or passed fewer tests than
its minimum, fails; a run of some tests only is judged on its exit codes. No venv is built."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_dev_stacks():
    spec = importlib.util.spec_from_file_location("dev_stacks", ROOT / "scripts" / "dev_stacks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dev_stacks = _load_dev_stacks()
MIN = dev_stacks.MIN_PASSED


def _result(name: str, code: int = 0, passed: int | None = None, **counts: int):
    """One run's result as run_all collects it: (name, exit code, closing counts, timing)."""
    passed = MIN[name] + 10 if passed is None else passed
    return (name, code, {"passed": passed, **counts}, "tests 1 s")


def _all_runs(**changes):
    """A full run's results, every run passing more than its minimum, but for ``changes``."""
    return [changes.get(name, _result(name)) for name in ("main", *dev_stacks.STACKS)]


def test_a_full_run_above_every_minimum_succeeds():
    assert dev_stacks._report(_all_runs(), full=True) == 0


def test_a_full_run_whose_stack_collected_nothing_fails(capsys):
    results = _all_runs(oldest=("oldest", 5, {}, "tests 1 s"))
    assert dev_stacks._report(results, full=True) == 5
    assert "collected no test in oldest" in capsys.readouterr().out


def test_a_full_run_where_every_run_collected_nothing_fails():
    results = [(name, 5, {}, "tests 1 s") for name in ("main", *dev_stacks.STACKS)]
    assert dev_stacks._report(results, full=True) != 0


@pytest.mark.parametrize("name", ["main", *dev_stacks.STACKS])
def test_a_full_run_passing_fewer_than_a_runs_minimum_fails(name, capsys):
    results = _all_runs(**{name: _result(name, passed=MIN[name] - 1, skipped=40)})
    assert dev_stacks._report(results, full=True) == 1
    assert f"{name} passed {MIN[name] - 1} < {MIN[name]}" in capsys.readouterr().out


def test_a_full_run_at_exactly_the_minimum_succeeds():
    results = [_result(name, passed=MIN[name]) for name in ("main", *dev_stacks.STACKS)]
    assert dev_stacks._report(results, full=True) == 0


def test_a_failing_test_fails_whatever_the_counts():
    results = _all_runs(newest=_result("newest", code=1, failed=1))
    assert dev_stacks._report(results, full=True) == 1
    assert dev_stacks._report(results, full=False) == 1


def test_a_partial_run_is_judged_on_exit_codes_only():
    few = [_result("main", passed=3), _result("oldest", passed=2)]
    assert dev_stacks._report(few, full=False) == 0
    # a stack none of whose selected tests matched the -k expression: the others ran
    assert dev_stacks._report([_result("main", passed=3), ("oldest", 5, {}, "")],
                              full=False) == 0
    assert dev_stacks._report([("main", 5, {}, ""), ("oldest", 5, {}, "")], full=False) == 5


def test_every_run_has_a_minimum():
    assert set(MIN) == {"main", *dev_stacks.STACKS}
    assert all(minimum > 0 for minimum in MIN.values())


def test_the_oldest_stack_runs_the_client_suites():
    suites = dev_stacks.STACKS["oldest"][2]
    assert set(suites) >= {"tests/test_model.py", "tests/test_routing.py",
                           "tests/test_processor.py", "tests/test_bad_inputs.py"}
    assert all((ROOT / suite).is_file() for suite in (*suites, *dev_stacks.STACKS["newest"][2]))


def test_split_tells_test_paths_from_options_and_their_values():
    options, paths = dev_stacks._split(ROOT, ["-x", "tests/test_model.py::test_call", "-k",
                                              "tests", "--timeout", "600", "tests/test_routing.py",
                                              "no_such_file.py"])
    assert paths == ["tests/test_model.py::test_call", "tests/test_routing.py"]
    assert options == ["-x", "-k", "tests", "--timeout", "600", "no_such_file.py"]
    assert dev_stacks._split(ROOT, []) == ([], [])


@pytest.mark.parametrize("args", [[], ["-x"], ["-q", "--timeout", "600"], ["-p", "no:randomly"]])
def test_a_command_line_without_selection_is_a_full_run(args):
    assert dev_stacks._is_full(*dev_stacks._split(ROOT, args))


@pytest.mark.parametrize("args", [["tests/test_model.py"], ["tests"], ["-k", "shm"], ["-kshm"],
                                  ["-k=shm"], ["-m", "not netlab"], ["--lf"],
                                  ["--deselect", "tests/test_model.py::test_call"],
                                  ["--co"], ["-q", "--collect-only"]])
def test_a_command_line_that_selects_tests_is_not_a_full_run(args):
    assert not dev_stacks._is_full(*dev_stacks._split(ROOT, args))


def test_the_main_run_lists_the_25_slowest_tests():
    assert dev_stacks._main_arguments(["-x", "tests/test_model.py"]) == [
        "--durations=25", "-x", "tests/test_model.py"]
    assert dev_stacks._main_arguments(["--durations=5"]) == ["--durations=5"]


def test_fast_runs_its_tier_unless_paths_are_given():
    assert dev_stacks.fast_arguments(["-x"]) is None
    assert dev_stacks.fast_arguments(["--fast", "-x"]) == ["-x", *dev_stacks.FAST_SUITES]
    assert dev_stacks.fast_arguments(["--fast", "tests/test_model.py"]) == ["tests/test_model.py"]
    root = Path(__file__).resolve().parents[1]
    assert all((root / suite).is_file() for suite in dev_stacks.FAST_SUITES)
