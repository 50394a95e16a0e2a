"""``coffea-sonic sample``: write the synthetic NanoAOD-like sample.

The top-level CLI wires it in with :func:`add_subparser` and dispatches to :func:`run`.

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="coffea-sonic")
>>> parser_for_sample = add_subparser(parser.add_subparsers(dest="command"))
>>> args = parser.parse_args(["sample", "--events", "100", "-o", "/tmp/out"])
>>> args.events, args.n_files, args.seed, args.output
(100, 2, 0, '/tmp/out')
"""

from __future__ import annotations

import argparse
import logging
import os

from ..cliargs import (add_deprecated_alias, add_json_option, add_list_option, add_output_option,
                       print_json)
from .synthetic import (DATASETS, DEFAULT_EVENTS_PER_DATASET, DEFAULT_FILES_PER_DATASET,
                        write_sample)

logger = logging.getLogger(__name__)

#: Where ``coffea-sonic sample`` writes without ``-o``.
DEFAULT_OUTPUT = "sonic-sample"

_DESCRIPTION = """\
Write a synthetic NanoAOD-like sample: ROOT files with an `Events` tree that coffea reads with
NanoAODSchema (or PFNanoAODSchema). Datasets: `ttbar` (b jets, hadronFlavour 5) and `qcd_light`
(light and charm jets only). Jets carry pt, eta, phi, mass, btagDeepFlavB, nConstituents,
hadronFlavour, partonFlavour and area; PF candidates come in the PFNano layout (PFCands and
JetPFCands). The content depends only on --seed, --events and --n-files.

Writes DIR/<dataset>_<i>.root and DIR/fileset.json (dataset -> file paths), then says what it
wrote: each file with its events and size (--json: the same as one JSON document)."""

_EPILOG = """\
example:
  coffea-sonic sample --events 20000 --n-files 2 -o ./sonic-sample
  python -c "from coffea.nanoevents import NanoEventsFactory, NanoAODSchema; \\
      print(NanoEventsFactory.from_root({'./sonic-sample/ttbar_0.root': 'Events'}, \\
      schemaclass=NanoAODSchema).events().Jet.pt)"
"""


def add_subparser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``sample`` on the CLI's ``subparsers``; the parsed args carry ``func=run``."""
    parser = subparsers.add_parser(
        "sample", help="write the synthetic NanoAOD-like sample (ttbar, qcd_light)",
        description=_DESCRIPTION, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_option(parser, DEFAULT_OUTPUT, what="the ROOT files and fileset.json")
    parser.add_argument("--events", type=_non_negative_int, default=DEFAULT_EVENTS_PER_DATASET,
                        help="events per dataset, split over the files (default: %(default)s)")
    n_files = parser.add_argument("--n-files", type=_positive_int,
                                  default=DEFAULT_FILES_PER_DATASET, metavar="N",
                                  help="files per dataset (default: %(default)s)")
    add_deprecated_alias(parser, "--files", n_files)
    parser.add_argument("--seed", type=int, default=0,
                        help="random seed; same seed, same content (default: %(default)s)")
    add_list_option(parser, "--datasets", choices=DATASETS, default=list(DATASETS),
                    help=f"datasets to write, from {', '.join(DATASETS)} (default: all)")
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Write the sample described by ``args``, print what was written, return exit status 0."""
    fileset = write_sample(args.output, events=args.events, files=args.n_files, seed=args.seed,
                           datasets=args.datasets)
    written = _written(fileset, os.path.join(os.path.abspath(args.output), "fileset.json"))
    if getattr(args, "json", False):
        print_json(written)
        return 0
    for entry in written["files"]:
        print(f"wrote {entry['path']}  ({entry['dataset']}, {entry['events']} events, "
              f"{_size(entry['bytes'])})")
    print(f"wrote {written['fileset']}  (fileset: {len(written['files'])} files, "
          f"{written['events']} events, {_size(written['bytes'])} in all)")
    return 0


def _written(fileset: dict[str, list[str]], fileset_path: str) -> dict:
    import uproot

    files = []
    for dataset, paths in fileset.items():
        for path in paths:
            with uproot.open(path) as handle:
                events = int(handle["Events"].num_entries)
            files.append({"dataset": dataset, "path": path, "events": events,
                          "bytes": os.path.getsize(path)})
    return {"fileset": fileset_path, "files": files,
            "events": sum(entry["events"] for entry in files),
            "bytes": sum(entry["bytes"] for entry in files)}


def _size(n_bytes: float) -> str:
    """A size for people.

    >>> _size(512), _size(1536), _size(3 * 1024**2)
    ('512 B', '1.5 KiB', '3.0 MiB')
    """
    if n_bytes < 1024:
        return f"{n_bytes:.0f} B"
    for unit in ("KiB", "MiB"):
        n_bytes /= 1024
        if n_bytes < 1024:
            break
    return f"{n_bytes:.1f} {unit}"


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
