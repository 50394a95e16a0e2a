"""``coffea-sonic config``: every setting's effective value and where it came from.

Example: docs/internals/command-line.md.
"""

from __future__ import annotations

import argparse
import sys

from .cliargs import add_json_option, add_list_option, print_json

_DESCRIPTION = """\
Print every coffea-sonic setting with its effective value and where it came from, in the order
they are looked up (first match wins): argument (what code passes, e.g. TritonModel(url,
transport=...); here: --set), environment (COFFEA_SONIC_<NAME>), Dask config (coffea_sonic.<name>,
also DASK_COFFEA_SONIC__<NAME>), the endpoints file ($COFFEA_SONIC_CONFIG, else
~/.config/coffea-sonic/endpoints.toml), default. Model endpoints follow the same order, except
that the URL declared in the processor comes last (a facility re-points models without code
edits); --model NAME=URL resolves a model as a processor declaring URL would get it.

Run it where the workers run (coffea-sonic check --on-workers checks servers from there); a
worker gets this environment's values through make_cluster.

examples:
  coffea-sonic config
  coffea-sonic config --json
  coffea-sonic config --model jet_tagger=triton+grpc://localhost:8001/jet_tagger
  coffea-sonic config --set transport=grpc fallback=cpu
"""


def _assignment(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, e.g. transport=grpc, not {text!r}")
    return name.strip(), value.strip()


def add_subparsers(subparsers: argparse._SubParsersAction) -> None:
    """Register ``config`` on the top-level CLI."""
    parser = subparsers.add_parser(
        "config", help="every setting: its value and where it came from",
        description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_list_option(parser, "--set", type=_assignment, split_commas=False, metavar="NAME=VALUE",
                    help="take these as arguments passed in code")
    add_list_option(parser, "--model", split_commas=False, metavar="NAME[=URL]",
                    help="also resolve these models (URL: the one the processor declares)")
    add_json_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from . import config
    from .model_options import checked_setting

    for name, value in args.set or []:  # refused here as TritonModel would refuse it
        config.spec(name)
        checked_setting(name, value)
    settings = config.effective_settings(dict(args.set or []))
    declared = dict(entry.partition("=")[::2] for entry in args.model or [])
    names = sorted(set(config.configured_models()) | set(declared))
    models = [config.resolve_model(name, declared.get(name) or None) for name in names]
    if args.json:
        specs = {entry.name: entry for entry in config.SETTINGS}
        print_json({
            "order": list(config.SOURCES),
            "settings": [{**vars(entry), "env": specs[entry.name].env,
                          "dask_key": specs[entry.name].dask_key,
                          "sources": list(specs[entry.name].sources),
                          "help": specs[entry.name].help} for entry in settings],
            "models": [vars(entry) for entry in models],
            "endpoints_file": {"path": str(config.config_file()),
                               "exists": config.config_file().is_file()}})
        return 0
    _print_table(settings, models)
    found = "found" if config.config_file().is_file() else "not found (optional)"
    sys.stdout.write(f"\nendpoints file: {config.config_file()} ({found})\n")
    return 0


def _print_table(settings: list, models: list) -> None:
    rows = [("SETTING", "VALUE", "SOURCE", "WHERE")]
    rows += [(entry.name, _text(entry.value), entry.source, entry.where) for entry in settings]
    rows += [(entry.name, _text(entry.value), entry.source, entry.where) for entry in models]
    widths = [min(max(len(row[i]) for row in rows), 60) for i in range(3)]
    for row in rows:
        sys.stdout.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3]))
                         + "  " + row[3] + "\n")
    if not models:
        sys.stdout.write("\nno model endpoints configured: processors use the URLs they declare "
                         "(COFFEA_SONIC_MODEL_<NAME> or COFFEA_SONIC_SERVERS re-point them)\n")


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "-"
    return str(value)
