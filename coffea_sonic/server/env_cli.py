"""``coffea-sonic server install|where``: the embedded server's own Python environment."""

from __future__ import annotations

import argparse
import sys

from ..cliargs import add_json_option, print_json
from ..errors import SonicError
from . import environment


def add_subparsers(subparsers: argparse._SubParsersAction) -> None:
    """Register ``server`` on the top-level CLI."""
    server = subparsers.add_parser(
        "server", help="the embedded tritonserver's own Python environment (nvidia-pytriton, "
                       "numpy < 2, onnxruntime, torch)",
        description=environment.__doc__.split(">>>")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = server.add_subparsers(dest="server_command", required=True)
    install = actions.add_parser(
        "install", help="build (or reuse) the cached server environment",
        description="Build the server's environment once; later starts reuse it. Examples:\n"
                    "  coffea-sonic server install\n"
                    "  coffea-sonic server install --python /usr/bin/python3.11\n"
                    "  coffea-sonic server install --wheels ./wheels   # no package index",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    install.add_argument("--python", default=None, metavar="PY",
                         help=f"a Python {environment.STUB_VERSIONS[-1]}-"
                              f"{environment.STUB_VERSIONS[0]} to build it with (default: "
                              f"${environment.PYTHON_SETTING}, else one found on PATH)")
    install.add_argument("--wheels", default=None, metavar="DIR",
                         help="install from this folder of wheels only (no package index)")
    install.add_argument("--force", action="store_true", help="rebuild even if it exists")
    add_json_option(install)
    install.set_defaults(func=run_install)
    where = actions.add_parser("where", help="print the Python the server would run from")
    add_json_option(where)
    where.set_defaults(func=run_where)


def run_install(args: argparse.Namespace) -> int:
    try:
        built = environment.install(args.python, args.wheels, force=args.force)
    except SonicError as error:
        print(f"coffea-sonic server install: {error}", file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print_json({"python": str(built.python), "version": built.version, "numpy": built.numpy})
        return 0
    print(f"server environment ready: {built.python} (Python {built.version}, numpy {built.numpy})")
    return 0


def run_where(args: argparse.Namespace) -> int:
    try:
        found = environment.resolve(build=False)
    except SonicError as error:
        print(f"coffea-sonic server where: {error}", file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print_json({"python": str(found.python)})
        return 0
    print(found.python)
    return 0
