"""``coffea-sonic bench cache``: what the inference cache and Triton's response cache save.

``--scenario demo-twice``: the demo twice with ``--inference-cache`` (wall times, requests of the second
run); ``--scenario users``: ten users running the same events against one server, response
cache off vs on (:mod:`coffea_sonic.bench.cache_runs`).

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="coffea-sonic bench")
>>> _ = register(parser.add_subparsers())
>>> args = parser.parse_args(["cache", "--scenario", "users", "--users", "4"])
>>> args.scenario, args.users, args.output
('users', 4, 'bench-output/cache')
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ...cliargs import add_deprecated_alias
from . import progress_printer, scenario_parser


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``cache`` to the ``bench`` scenarios."""
    parser = scenario_parser(
        subparsers, "cache", help="the demo twice with the inference cache; users sharing a response cache",
        description=(
            "demo-twice: coffea-sonic demo --inference-cache DIR twice (own server and Dask each time).\n"
            "users: N users run the demo's analysis on the same events against one server, "
            "Triton's response cache off, then on.\n\n"
            "examples:\n  coffea-sonic bench cache --scenario demo-twice -o cache\n"
            "  coffea-sonic bench cache --scenario users --users 10 -o cache"))
    parser.add_argument("--scenario", choices=("demo-twice", "users"), default="demo-twice",
                        help="demo-twice: the demo twice with an inference cache; users: N users "
                             "sharing one server's response cache (default: %(default)s)")
    parser.add_argument("--users", type=int, default=10, help="users (default: %(default)s)")
    parser.add_argument("--events", type=int, default=20_000,
                        help="events per dataset, 2 datasets (default: %(default)s)")
    stagger = parser.add_argument("--stagger-s", type=float, default=2.0, metavar="SECONDS",
                                  help="users start this many seconds apart (default: "
                                       "%(default)s)")
    add_deprecated_alias(parser, "--stagger", stagger)
    parser.add_argument("--cache-size", default="1GB", help="response cache size (default 1GB)")
    parser.add_argument("--demo-args", default="", metavar="ARGS",
                        help="more options for both demo runs, e.g. '--device gpu --workers 8'")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """``<scenario>.json`` in ``--output``."""
    from ..cache_runs import demo_twice, shared_users

    started = time.perf_counter()
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    progress = progress_printer(started)
    if args.scenario == "demo-twice":
        results = demo_twice(output, args.demo_args.split(), progress)
    else:
        results = shared_users(output, users=args.users, events=args.events,
                               stagger_s=args.stagger_s, cache_size=args.cache_size,
                               progress=progress)
    path = output / f"{args.scenario}.json"
    path.write_text(json.dumps(results, indent=2, default=str))
    print(json.dumps({key: value for key, value in results.items()
                      if key not in ("runs", "settings")}, indent=2, default=str))
    print(f"  results: {path}")
    return 0
