"""The ``coffea-sonic bench SCENARIO`` subcommands: one module here per scenario.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from ...cliargs import add_output_option
from ...errors import SonicError

__all__ = ["DEFAULT_OUTPUT_ROOT", "add_numbers", "add_output", "print_written",
           "progress_printer", "register_all", "run_scenario", "scenario_names", "scenario_parser"]

#: Scenarios write into DEFAULT_OUTPUT_ROOT/SCENARIO unless ``-o`` says otherwise.
DEFAULT_OUTPUT_ROOT = "bench-output"


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
                    description: str) -> argparse.ArgumentParser:
    """The parser of scenario ``name``: its one-line ``help``, its ``description`` (printed as
    written, examples included) and ``-o/--output DIR`` (default ``bench-output/NAME``)."""
    parser = subparsers.add_parser(name, help=help, description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output(parser, name)
    return parser


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
