"""The ``coffea-sonic bench SCENARIO`` subcommands: one module here per scenario.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from ...cliargs import add_deprecated_alias, add_output_option
from ...errors import SonicError

__all__ = ["DEFAULT_OUTPUT_ROOT", "OLD_SPELLINGS", "add_json_file", "add_numbers", "add_output",
           "old_spellings", "print_finished", "print_written", "progress_printer", "register_all",
           "run_scenario", "scenario_names", "scenario_parser"]

#: Scenarios write into DEFAULT_OUTPUT_ROOT/SCENARIO unless ``-o`` says otherwise.
DEFAULT_OUTPUT_ROOT = "bench-output"
#: Options renamed alike in every scenario: the old spelling still works, hidden, and warns.
OLD_SPELLINGS = {"--out": "--output", "--duration": "--duration-s", "--window": "--window-s",
                 "--json": "--json-file", "--stagger": "--stagger-s"}


def scenario_names() -> list[str]:
    """The scenario modules of this package, sorted (``suite`` first: it is the main one)."""
    names = sorted(info.name for info in pkgutil.iter_modules(__path__)
                   if not info.name.startswith("_"))
    return sorted(names, key=lambda name: name != "suite")


def register_all(subparsers: argparse._SubParsersAction) -> list[str]:
    """Import every scenario module and let it register its parser; returns the names."""
    names = scenario_names()
    for name in names:
        module = importlib.import_module(f"{__name__}.{name}")
        module.register(subparsers)
    return names


def add_output(parser: argparse.ArgumentParser, scenario: str) -> argparse.Action:
    """``-o/--output DIR`` of a scenario, default ``bench-output/SCENARIO``."""
    return add_output_option(parser, f"{DEFAULT_OUTPUT_ROOT}/{scenario}")


def scenario_parser(subparsers: argparse._SubParsersAction, name: str, *, help: str,
                    description: str, run: Callable[[argparse.Namespace], int] | None = None
                    ) -> argparse.ArgumentParser:
    """The parser of scenario ``name``: its one-line ``help``, its ``description`` (printed as
    written, examples included), ``-o/--output DIR`` (default ``bench-output/NAME``) and ``run``,
    the function that runs it (``func``)."""
    parser = subparsers.add_parser(name, help=help, description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output(parser, name)
    if run is not None:
        parser.set_defaults(func=run)
    return parser


def old_spellings(parser: argparse.ArgumentParser, *old: str) -> argparse.ArgumentParser:
    """Keep each ``old`` spelling (of :data:`OLD_SPELLINGS`) working, hidden and warning; the
    parser.

    >>> parser = old_spellings(scenario_parser(argparse.ArgumentParser().add_subparsers(), "x",
    ...                                        help="", description=""), "--out")
    >>> import warnings
    >>> with warnings.catch_warnings(record=True):
    ...     parser.parse_args(["--out", "o"]).output
    'o'
    """
    for spelling in old:
        add_deprecated_alias(parser, spelling,
                             parser._option_string_actions[OLD_SPELLINGS[spelling]])
    return parser


def add_json_file(parser: argparse.ArgumentParser, what: str) -> argparse.Action:
    """``--json-file FILE``: also write ``what`` there (besides the file in ``-o``)."""
    return parser.add_argument("--json-file", metavar="FILE", help=f"also write {what} here")


def add_numbers(parser: argparse.ArgumentParser,
                options: Sequence[tuple[str, type, int | float | None, str]]) -> None:
    """Numeric options from ``(flag, int or float, default, what)`` rows; the help says the
    default.

    >>> parser = argparse.ArgumentParser()
    >>> add_numbers(parser, [("--rounds", int, 3, "windows per configuration")])
    >>> parser.parse_args(["--rounds", "5"]).rounds, parser.parse_args([]).rounds
    (5, 3)
    """
    for flag, kind, default, what in options:
        parser.add_argument(flag, type=kind, default=default,
                            help=f"{what} (default: %(default)s)")


def progress_printer(started: float | None = None) -> Callable[[str], None]:
    """A ``progress(message)`` callback printing elapsed seconds and the message to stderr."""
    origin = time.perf_counter() if started is None else started

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - origin:6.1f} s] {message}", file=sys.stderr, flush=True)

    return progress


def print_written(written: Mapping[str, object]) -> None:
    """One line per file a scenario wrote: ``  name: path``."""
    for name, path in written.items():
        print(f"  {name}: {path}")


def print_finished(title: str, started: float, lines: Iterable[str] = (),
                   written: Mapping[str, object] | None = None) -> None:
    """How a scenario ends: ``bench TITLE finished in N s``, its summary ``lines`` and the files
    it wrote (:func:`print_written`).

    >>> print_finished("demo", time.perf_counter(), ["  all good"], {"json": "out/r.json"})
    bench demo finished in 0 s
      all good
      json: out/r.json
    """
    print(f"bench {title} finished in {time.perf_counter() - started:.0f} s")
    for line in lines:
        print(line)
    print_written(written or {})


def run_scenario(name: str, argv: list[str], *, prog: str | None = None,
                 level: int = logging.WARNING) -> int:
    """Parse ``argv`` as scenario ``name``'s options and run it, logging at ``level``; the exit
    code. Imports that scenario's module only, not the CLI's other commands.

    >>> run_scenario("pipeline", ["--help"], prog="pipeline_bench.py")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    SystemExit: 0
    """
    parser = argparse.ArgumentParser(prog=prog or f"coffea-sonic bench {name}")
    module = importlib.import_module(f"{__name__}.{name}")
    module.register(parser.add_subparsers(dest="scenario"))
    args = parser.parse_args([name, *argv])
    logging.basicConfig(level=level, format="%(asctime)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except SonicError as error:  # as the CLI does: the message says what to do, no traceback
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
