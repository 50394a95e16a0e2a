"""Option conventions shared by every ``coffea-sonic`` subcommand (output folders, lists, servers,
devices, renamed options, ``--json``, ``-v``), with examples: docs/internals/command-line.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["DEVICE_CHOICES", "DeprecatedAlias", "ListAction", "add_deprecated_alias",
           "add_device_option", "add_json_option", "add_list_option", "add_output_option",
           "add_server_options", "add_verbose_everywhere", "plain", "print_json",
           "resolve_device", "verbosity", "warn_deprecated"]

#: What every ``--device`` option offers.
DEVICE_CHOICES = ("auto", "cpu", "gpu")


class ListAction(argparse.Action):
    """``nargs="+"`` whose values may also hold comma-separated items, converted and checked
    one by one (argparse would check ``choices`` against ``"a,b"`` as a whole)."""

    def __init__(self, option_strings: Sequence[str], dest: str, *,
                 item_type: Callable[[str], Any] = str, item_choices: Iterable[Any] | None = None,
                 split_commas: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("nargs", "+")
        super().__init__(option_strings, dest, **kwargs)
        self.item_type = item_type
        self.item_choices = tuple(item_choices) if item_choices is not None else None
        self.split_commas = split_commas

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        items: list[Any] = []
        for value in values:
            parts = value.split(",") if self.split_commas else [value]
            for part in (part.strip() for part in parts):
                if not part:
                    continue
                try:
                    item = self.item_type(part)
                except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
                    raise argparse.ArgumentError(self, f"invalid value {part!r}: {error}") from None
                if self.item_choices is not None and item not in self.item_choices:
                    raise argparse.ArgumentError(self, f"invalid choice {part!r} (choose from "
                                                       f"{', '.join(map(str, self.item_choices))})")
                items.append(item)
        if not items:
            raise argparse.ArgumentError(self, "expected at least one value")
        setattr(namespace, self.dest, items)


def add_list_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *flags: str,
                    type: Callable[[str], Any] = str, choices: Iterable[Any] | None = None,
                    split_commas: bool = True, metavar: str | None = None,
                    **kwargs: Any) -> argparse.Action:
    """A list option of the CLI's one convention (docs/internals/command-line.md)."""
    if metavar is None:
        metavar = "N" if type in (int, float) else "NAME"
    return parser.add_argument(*flags, action=ListAction, item_type=type, item_choices=choices,
                               split_commas=split_commas, metavar=metavar, **kwargs)


def add_output_option(parser: argparse.ArgumentParser, default: str | None,
                      what: str = "results") -> argparse.Action:
    """``-o/--output DIR``: the folder a command writes into (created when missing)."""
    where = f" (default: ./{default}/)" if default else ""
    return parser.add_argument("-o", "--output", default=default, metavar="DIR",
                               help=f"folder to write {what} into{where}")


def add_server_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                       server_help: str = "existing Triton server: host:port or "
                                          "triton+grpc://host:port",
                       metavar: str = "URL", device_default: str | None = "auto") -> None:
    """``--server`` (a running server; ``server_help`` says which address form) and ``--device``
    (where the embedded server runs when ``--server`` is not given; None means auto).

    >>> parser = argparse.ArgumentParser(prog="demo")
    >>> add_server_options(parser)
    >>> args = parser.parse_args(["--device", "cpu"])
    >>> args.server, args.device
    (None, 'cpu')
    """
    parser.add_argument("--server", metavar=metavar,
                        help=f"{server_help} (default: start the embedded one)")
    add_device_option(parser, default=device_default,
                      help="device of the embedded server (default auto: GPU if nvidia-smi "
                           "sees one)")


def add_device_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                      default: str | None = "auto", help: str) -> argparse.Action:
    """``--device {auto,cpu,gpu}``, the same choices everywhere (:func:`resolve_device`)."""
    return parser.add_argument("--device", choices=DEVICE_CHOICES, default=default, help=help)


def resolve_device(device: str | None) -> str:
    """``cpu`` or ``gpu``: ``auto`` (or None) is ``gpu`` where ``nvidia-smi`` lists a GPU.

    >>> resolve_device("cpu"), resolve_device("gpu")
    ('cpu', 'gpu')
    """
    if device in ("cpu", "gpu"):
        return device
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    return "gpu" if listed.returncode == 0 and "GPU" in listed.stdout else "cpu"


class DeprecatedAlias(argparse.Action):
    """An old spelling of ``target``: warns (:class:`FutureWarning`, naming the new spelling),
    then does what ``target`` does with the values (``convert`` first maps them, e.g. ms to us)."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, target: argparse.Action,
                 convert: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
        kwargs.update(nargs=target.nargs, const=target.const, type=target.type,
                      choices=target.choices, metavar=target.metavar)
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                         **kwargs)
        self.target = target
        self.convert = convert

    @property
    def new_spelling(self) -> str:
        return max(self.target.option_strings, key=len)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        warn_deprecated(parser, str(option_string), self.new_spelling)
        if self.convert is not None:
            values = self.convert(values)
        self.target(parser, namespace, values, self.new_spelling)


def warn_deprecated(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """The one deprecation warning of the CLI: a :class:`FutureWarning` naming the new spelling,
    shown as coming from the command (``coffea-sonic check:0: FutureWarning: ...``), not from
    argparse's source."""
    warnings.warn_explicit(f"{old} is deprecated and will be removed in the next release: "
                           f"use {new}", FutureWarning, filename=parser.prog, lineno=0,
                           module="coffea_sonic.cli")


def add_deprecated_alias(parser: argparse.ArgumentParser | argparse._ArgumentGroup, old: str,
                         target: argparse.Action, *,
                         convert: Callable[[Any], Any] | None = None) -> argparse.Action:
    """Keep ``old`` working as a hidden, warning spelling of the option ``target``.

    >>> import warnings
    >>> parser = argparse.ArgumentParser(prog="check")
    >>> new = parser.add_argument("--timeout-s", type=float, help="seconds")
    >>> _ = add_deprecated_alias(parser, "--timeout", new)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     parser.parse_args(["--timeout", "3"])
    Namespace(timeout_s=3.0)
    >>> str(caught[0].message)
    '--timeout is deprecated and will be removed in the next release: use --timeout-s'
    """
    return parser.add_argument(old, action=DeprecatedAlias, dest=target.dest, target=target,
                               convert=convert)


def add_json_option(parser: argparse.ArgumentParser) -> argparse.Action:
    """``--json``: one JSON document on stdout instead of the text report."""
    return parser.add_argument("--json", action="store_true",
                               help="print JSON instead of text (same exit code)")


def print_json(document: Any) -> None:
    """Print ``document`` as indented JSON: dataclasses as objects, paths as strings, NaN as null.

    >>> print_json({"a": float("nan"), "b": (1, 2)})
    {
      "a": null,
      "b": [
        1,
        2
      ]
    }
    """
    json.dump(plain(document), sys.stdout, indent=2)
    sys.stdout.write("\n")
    sys.stdout.flush()


def plain(value: Any) -> Any:
    """``value`` as plain JSON types (what :func:`print_json` prints)."""
    import dataclasses
    import math
    from pathlib import PurePath

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(item) for item in value]
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


_VERBOSE_DEST = "_verbose_level"


def add_verbose_everywhere(parser: argparse.ArgumentParser, depth: int = 0) -> None:
    """Give every subcommand (at any depth) of ``parser`` its own ``-v/--verbose``, so the flag
    works after the subcommand too; :func:`verbosity` adds up all of them."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for subparser in set(action.choices.values()):
            if not any("-v" in other.option_strings for other in subparser._actions):
                subparser.add_argument("-v", "--verbose", action="count",
                                       dest=f"{_VERBOSE_DEST}{depth + 1}",
                                       default=argparse.SUPPRESS,
                                       help="more logging (-v info, -vv debug)")
            add_verbose_everywhere(subparser, depth + 1)


def verbosity(args: argparse.Namespace) -> int:
    """How many ``-v`` were given, wherever they were given."""
    return int(getattr(args, "verbose", 0) or 0) + sum(
        int(value) for name, value in vars(args).items() if name.startswith(_VERBOSE_DEST))
