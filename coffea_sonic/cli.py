"""The ``coffea-sonic`` command: serve | models | demo | bench | sample | check | monitor | config.

Each subcommand registers itself here and imports its code only when it runs; conventions, with
examples: docs/internals/command-line.md.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from . import __version__
from .cliargs import add_verbose_everywhere, verbosity
from .errors import SonicError

# Modules that provide ``add_subparsers(subparsers)``; a missing one is skipped so the CLI keeps
# working while a feature is absent from an installation.
_SUBCOMMAND_MODULES = (
    "coffea_sonic.server.cli",
    "coffea_sonic.server.env_cli",
    "coffea_sonic.demo",
    "coffea_sonic.bench.cli",
    "coffea_sonic.data.cli",
    "coffea_sonic.facility.cli",
    "coffea_sonic.config_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coffea-sonic",
        description=(
            "SONIC-style inference as a service for coffea analyses: run the embedded Triton "
            "server, the demo analysis, benchmarks, and facility checks.\n\n"
            "first steps:\n"
            "  coffea-sonic demo             # sample data + local server + Dask + plot, < 5 min\n"
            "  coffea-sonic serve            # a real Triton server with the model zoo\n"
            "  coffea-sonic bench suite --quick   # CPU vs served vs coffea's triton_wrapper\n"
            "  coffea-sonic config           # every setting, its value and where it came from\n"
            "  coffea-sonic SUBCOMMAND --help"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-v info, -vv debug); also after the subcommand")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    for module_name in _SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if not (error.name and module_name.startswith(error.name)):
                raise
            continue
        register = getattr(module, "add_subparsers", None) or getattr(module, "add_subparser")
        register(subparsers)
    add_verbose_everywhere(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.verbose = verbosity(args)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SonicError as error:
        # our errors say what went wrong and what to do: the message, not a traceback (-v: both)
        if args.verbose:
            logging.getLogger("coffea_sonic.cli").exception("%s failed", args.command)
        print(f"coffea-sonic {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
