"""``coffea-sonic bench ragged``: bytes on the wire, ragged requests vs padded tensors.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ...zoo.spec import PARTICLENET_FEATURES
from ..files import write_json
from ..probes import percentile
from . import add_json_file, add_numbers, old_spellings, scenario_parser

__all__ = ["measure", "multiplicity", "register", "saving", "summary_lines"]

PF_FIELDS = ("pt", "eta", "phi", "mass", "charge")
#: ParticleNet values per constituent: 2 points (deta, dphi) + the features
PN_VALUES = 2 + len(PARTICLENET_FEATURES)
FLOAT = 4

_DESCRIPTION = """\
What TritonModel sends (in-memory transport: bytes counted, not timed) on the synthetic sample,
for per-event PF candidates (ragged vs padded to the sample's and each request's largest event)
and per-jet ParticleNet constituents (ragged vs particlenet_lite's padded-to-32 tensors).
Writes ragged_bytes.json into -o DIR (and --json-file FILE).

examples:
  coffea-sonic bench ragged                        # 20k events per dataset (about a minute)
  coffea-sonic bench ragged --events 2000 -o /tmp/ragged
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``ragged`` to the ``bench`` scenarios."""
    from ...data.synthetic import DEFAULT_EVENTS_PER_DATASET
    from ...model import TRANSPORT_DEFAULTS

    parser = scenario_parser(subparsers, "ragged", run=run, description=_DESCRIPTION,
                             help="bytes on the wire: ragged requests vs padded tensors")
    add_numbers(parser, [
        ("--events", int, DEFAULT_EVENTS_PER_DATASET, "events per dataset, ttbar and qcd_light"),
        ("--seed", int, 0, "the sample's seed"),
        ("--cap", int, TRANSPORT_DEFAULTS["grpc"][0], "max_request_bytes (gRPC's)")])
    add_json_file(parser, "the results")
    return old_spellings(parser, "--json")


def run(args: argparse.Namespace) -> int:
    """Measure, print the two summary lines, write the JSON."""
    result = measure(args.events, args.seed, args.cap)
    for line in summary_lines(result):
        print(line)
    write_json(result, args.output, "ragged_bytes.json", args.json_file)
    return 0


def _read_sample(fileset: dict[str, list[str]]) -> Any:
    import awkward as ak
    import uproot

    parts = []
    for paths in fileset.values():
        for path in paths:
            tree = uproot.open(path)["Events"]
            branches = tree.arrays(
                ["Jet_pt", "Jet_eta", "Jet_phi", "Jet_mass", "JetPFCands_jetIdx",
                 "JetPFCands_pFCandsIdx", *(f"PFCands_{f}" for f in PF_FIELDS)])
            parts.append(ak.zip({
                "Jet": ak.zip({f: branches[f"Jet_{f}"] for f in ("pt", "eta", "phi", "mass")}),
                "PFCands": ak.zip({f: branches[f"PFCands_{f}"] for f in PF_FIELDS}),
                "JetPFCands": ak.zip({"jetIdx": branches["JetPFCands_jetIdx"],
                                      "pFCandsIdx": branches["JetPFCands_pFCandsIdx"]}),
            }, depth_limit=1))
    return ak.concatenate(parts)


def _ragged_bytes_sent(name: str, rows: np.ndarray, counts: np.ndarray, cap: int) -> dict:
    """Send ``rows`` of events ``counts`` through TritonModel to a ragged model; its bytes."""
    from ...core.tensors import ModelInfo, TensorInfo
    from ...errors import InferenceError
    from ...model import TritonModel
    from ...ragged import RaggedCall
    from ...transport.memory import MemoryTransport
    from ..clients import fresh_clients

    fresh_clients()
    info = ModelInfo(
        name, ("1",), "python", 64,
        (TensorInfo("x", "FP32", (-1, rows.shape[1])), TensorInfo("x__counts", "INT64", (-1,))),
        (TensorInfo("per_object", "FP32", (-1,)), TensorInfo("per_event", "FP32", (1,))),
        ragged_inputs=("x", "x__counts"), ragged_outputs=("per_object",))

    def engine(inputs: dict) -> dict:
        return {"per_object": np.zeros((1, len(inputs["x"][0])), np.float32),
                "per_event": np.zeros((len(inputs["x__counts"][0]), 1), np.float32)}

    transport = MemoryTransport({name: (info, engine)}, address="mem:1")
    model = TritonModel(f"triton+grpc://mem:1/{name}", max_request_bytes=cap,
                        transport=MemoryTransport.factory({"mem:1": transport}))
    out = model({"x": rows}, counts=counts)
    if len(out["per_object"]) != len(rows) or len(out["per_event"]) != len(counts):
        raise InferenceError(f"model {name!r}: expected {len(rows)} per_object and {len(counts)} "
                             f"per_event rows, got {len(out['per_object'])} and "
                             f"{len(out['per_event'])}")
    groups = RaggedCall.build(info, {"x": rows}, counts).plan(cap)
    transport.close()
    return {"bytes": int(model.stats.bytes_sent), "requests": int(model.stats.requests),
            "groups": [(a, b) for a, b, _ in groups]}


def _padded_to_group_max(counts: np.ndarray, groups: list[tuple[int, int]],
                        row_bytes: int) -> int:
    return int(sum((b - a) * int(counts[a:b].max(initial=0)) * (row_bytes + FLOAT)
                   for a, b in groups))


def multiplicity(counts: np.ndarray) -> dict:
    """Entries, total, mean, max, median and 99th percentile of per-entry counts."""
    return {"entries": int(len(counts)), "total": int(counts.sum()),
            "mean": round(float(counts.mean()), 2), "max": int(counts.max()),
            "p50": percentile(counts, 50), "p99": percentile(counts, 99)}


def saving(ragged: int, padded: int) -> float:
    """Percent fewer bytes ragged than padded."""
    return round(100.0 * (1.0 - ragged / padded), 1)


def _pf_candidates(events: Any, cap: int) -> dict:
    """Per-event PF candidates: ragged vs padded to the sample's and to each request's max."""
    import awkward as ak

    candidates = events.PFCands
    per_event = ak.to_numpy(ak.num(candidates, axis=1)).astype(np.int64)
    pf_rows = np.stack([ak.to_numpy(ak.flatten(candidates[f])).astype(np.float32)
                        for f in PF_FIELDS], axis=1)
    pf_row_bytes = len(PF_FIELDS) * FLOAT
    ragged = _ragged_bytes_sent("pf_candidates", pf_rows, per_event, cap)
    padded_max = len(per_event) * int(per_event.max()) * (pf_row_bytes + FLOAT)
    padded_groups = _padded_to_group_max(per_event, ragged["groups"], pf_row_bytes)
    return {
        "values_per_row": list(PF_FIELDS), "multiplicity": multiplicity(per_event),
        "ragged_bytes": ragged["bytes"], "ragged_requests": ragged["requests"],
        "padded_to_sample_max_bytes": padded_max,
        "padded_to_request_max_bytes": padded_groups,
        "saving_vs_sample_max_pct": saving(ragged["bytes"], padded_max),
        "saving_vs_request_max_pct": saving(ragged["bytes"], padded_groups),
    }


def _constituents(events: Any, cap: int) -> dict:
    """Per-jet constituents, ParticleNet layout: ragged (all, and truncated to 32) vs
    particlenet_lite's padded-to-32 tensors and padding to the largest jet."""
    import awkward as ak

    from ... import columns
    from ...zoo.inputs import pad_constituents
    from ...zoo.spec import PARTICLENET_MAX_CONSTITUENTS

    constituents = columns.jet_constituents(events)
    padded32 = int(sum(array.nbytes for array in
                       pad_constituents(constituents, events.Jet).values()))
    per_jet = ak.to_numpy(ak.flatten(ak.num(constituents, axis=2))).astype(np.int64)
    kept = np.minimum(per_jet, PARTICLENET_MAX_CONSTITUENTS)
    ragged = _ragged_bytes_sent("constituents", np.zeros((int(per_jet.sum()), PN_VALUES),
                                                        np.float32), per_jet, cap)
    ragged32 = _ragged_bytes_sent("constituents32", np.zeros((int(kept.sum()), PN_VALUES),
                                                            np.float32), kept, cap)
    padded_max = len(per_jet) * int(per_jet.max()) * (PN_VALUES * FLOAT + FLOAT)
    return {
        "values_per_row": PN_VALUES, "multiplicity": multiplicity(per_jet),
        "constituents_beyond_32_dropped_by_padding": int((per_jet - kept).sum()),
        "particlenet_lite_padded_32_bytes": padded32,
        "padded_to_sample_max_bytes": padded_max,
        "ragged_bytes": ragged["bytes"], "ragged_requests": ragged["requests"],
        "ragged_truncated_32_bytes": ragged32["bytes"],
        "saving_vs_padded_32_pct": saving(ragged["bytes"], padded32),
        "saving_truncated_32_vs_padded_32_pct": saving(ragged32["bytes"], padded32),
        "saving_vs_sample_max_pct": saving(ragged["bytes"], padded_max),
    }


def measure(events_per_dataset: int, seed: int, cap: int) -> dict:
    """Write the sample (``events_per_dataset`` per dataset), read it back, and compare the bytes
    of both inputs ragged and padded, with requests of at most ``cap`` bytes."""
    from ...data.synthetic import write_sample
    from ..machine import machine_info

    with tempfile.TemporaryDirectory() as directory:
        fileset = write_sample(directory, events=events_per_dataset, files=1, seed=seed)
        events = _read_sample(fileset)
    return {
        "what": "bytes sent: ragged requests vs padded tensors (coffea-sonic bench ragged)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine_info(),
        "sample": {"events_per_dataset": events_per_dataset, "datasets": sorted(fileset),
                   "seed": seed, "max_request_bytes": cap},
        "pf_candidates_per_event": _pf_candidates(events, cap),
        "constituents_per_jet": _constituents(events, cap),
    }


def summary_lines(result: dict) -> list[str]:
    """Two lines: what ragged requests save for each input."""
    pf, pn = result["pf_candidates_per_event"], result["constituents_per_jet"]
    pfm, pnm = pf["multiplicity"], pn["multiplicity"]
    return [
        f"PF candidates per event ({pfm['entries']} events, mean {pfm['mean']:.1f}, max "
        f"{pfm['max']}): ragged {pf['ragged_bytes']} B vs padded to the sample max "
        f"{pf['padded_to_sample_max_bytes']} B ({pf['saving_vs_sample_max_pct']:.1f} % fewer), "
        f"to each request's max {pf['padded_to_request_max_bytes']} B "
        f"({pf['saving_vs_request_max_pct']:.1f} % fewer)",
        f"constituents per jet ({pnm['entries']} jets, mean {pnm['mean']:.1f}, max "
        f"{pnm['max']}): ragged {pn['ragged_bytes']} B vs particlenet_lite's padded-to-32 "
        f"{pn['particlenet_lite_padded_32_bytes']} B ({pn['saving_vs_padded_32_pct']:.1f} % "
        f"fewer; truncated to 32 as well: {pn['saving_truncated_32_vs_padded_32_pct']:.1f} % "
        f"fewer), vs padded to the max {pn['padded_to_sample_max_bytes']} B "
        f"({pn['saving_vs_sample_max_pct']:.1f} % fewer)"]
