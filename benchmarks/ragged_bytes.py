"""Bytes on the wire: ragged requests (coffea_sonic.ragged) vs padded tensors, on the sample.

Writes the synthetic PFNano-like sample (``coffea_sonic.data.synthetic.write_sample``), reads its
multiplicities back from the ROOT files, and compares what the client sends for two inputs:

* **per-event PF candidates** (a DeepMET-like input: pt, eta, phi, mass, charge per candidate):
  padded to the sample's largest event (a fixed-shape model with a mask), padded to the largest
  event of each request (the same groups as the ragged call: the best padding can do), and
  ragged (rows unpadded + 8 bytes of count per event);
* **per-jet constituents** in the ParticleNet layout (2 points + 7 features per constituent):
  ``particlenet_lite``'s padded tensors (32 per jet with a mask, built by
  ``zoo.inputs.pad_constituents``, dropping constituents beyond 32), padded to the largest jet, and
  ragged (all constituents, and truncated to 32 for a like-for-like comparison).

Ragged bytes are measured, not computed: the calls go through :class:`~coffea_sonic.TritonModel`
on the in-memory transport and ``model.stats.bytes_sent`` is what the requests carried.

    python benchmarks/ragged_bytes.py                       # 20k events per dataset
    python benchmarks/ragged_bytes.py --events 2000 --json /tmp/ragged.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import platform
import sys
import tempfile
from pathlib import Path

import awkward as ak
import numpy as np
import uproot

from coffea_sonic import columns
from coffea_sonic.core.tensors import ModelInfo, TensorInfo
from coffea_sonic.data.synthetic import DEFAULT_EVENTS_PER_DATASET, write_sample
from coffea_sonic.model import TRANSPORT_DEFAULTS, TritonModel
from coffea_sonic.ragged import RaggedCall
from coffea_sonic.routing import clear_routers
from coffea_sonic.transport.memory import MemoryTransport
from coffea_sonic.zoo.inputs import pad_constituents
from coffea_sonic.zoo.spec import PARTICLENET_FEATURES, PARTICLENET_MAX_CONSTITUENTS

logger = logging.getLogger("ragged_bytes")

PF_FIELDS = ("pt", "eta", "phi", "mass", "charge")
#: ParticleNet values per constituent: 2 points (deta, dphi) + the features
PN_VALUES = 2 + len(PARTICLENET_FEATURES)
FLOAT = 4


def read_sample(fileset: dict[str, list[str]]) -> ak.Array:
    """Every event of the sample with Jet, PFCands and JetPFCands (the fields used here)."""
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


def ragged_info(name: str, values: int) -> ModelInfo:
    """A ragged model taking ``values`` float32 per object, one float per object and event."""
    return ModelInfo(
        name, ("1",), "python", 64,
        (TensorInfo("x", "FP32", (-1, values)), TensorInfo("x__counts", "INT64", (-1,))),
        (TensorInfo("per_object", "FP32", (-1,)), TensorInfo("per_event", "FP32", (1,))),
        ragged_inputs=("x", "x__counts"), ragged_outputs=("per_object",))


def _engine(inputs: dict) -> dict:
    rows, counts = inputs["x"][0], inputs["x__counts"][0]
    return {"per_object": np.zeros((1, len(rows)), np.float32),
            "per_event": np.zeros((len(counts), 1), np.float32)}


def ragged_bytes_sent(name: str, rows: np.ndarray, counts: np.ndarray, cap: int) -> dict:
    """Send ``rows`` (per-object values) of events ``counts`` through TritonModel; its bytes."""
    clear_routers()
    info = ragged_info(name, rows.shape[1])
    transport = MemoryTransport({name: (info, _engine)}, address="mem:1")
    model = TritonModel(f"triton+grpc://mem:1/{name}", max_request_bytes=cap,
                        transport=MemoryTransport.factory({"mem:1": transport}))
    out = model({"x": rows}, counts=counts)
    assert len(out["per_object"]) == len(rows) and len(out["per_event"]) == len(counts)
    groups = RaggedCall.build(info, {"x": rows}, counts).plan(cap)
    transport.close()
    return {"bytes": int(model.stats.bytes_sent), "requests": int(model.stats.requests),
            "groups": [(a, b) for a, b, _ in groups]}


def padded_to_group_max(counts: np.ndarray, groups: list[tuple[int, int]],
                        row_bytes: int) -> int:
    """Bytes of the same groups padded to each group's largest entry (values + a float mask)."""
    return int(sum((b - a) * int(counts[a:b].max(initial=0)) * (row_bytes + FLOAT)
                   for a, b in groups))


def multiplicity(counts: np.ndarray) -> dict:
    return {"entries": int(len(counts)), "total": int(counts.sum()),
            "mean": round(float(counts.mean()), 2), "max": int(counts.max()),
            "p50": float(np.percentile(counts, 50)), "p99": float(np.percentile(counts, 99))}


def saving(ragged: int, padded: int) -> float:
    return round(100.0 * (1.0 - ragged / padded), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS_PER_DATASET,
                        help="events per dataset (ttbar and qcd_light)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cap", type=int, default=TRANSPORT_DEFAULTS["grpc"][0],
                        help="max_request_bytes (default: gRPC's)")
    parser.add_argument("--json", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "ragged_bytes.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    with tempfile.TemporaryDirectory() as directory:
        fileset = write_sample(directory, events=args.events, files=1, seed=args.seed)
        events = read_sample(fileset)
    cap = args.cap

    # per-event PF candidates
    candidates = events.PFCands
    per_event = ak.to_numpy(ak.num(candidates, axis=1)).astype(np.int64)
    pf_rows = np.stack([ak.to_numpy(ak.flatten(candidates[f])).astype(np.float32)
                        for f in PF_FIELDS], axis=1)
    pf_row_bytes = len(PF_FIELDS) * FLOAT
    pf_ragged = ragged_bytes_sent("pf_candidates", pf_rows, per_event, cap)
    pf_padded_max = len(per_event) * int(per_event.max()) * (pf_row_bytes + FLOAT)
    pf_padded_groups = padded_to_group_max(per_event, pf_ragged["groups"], pf_row_bytes)

    # per-jet constituents, ParticleNet layout
    constituents = columns.jet_constituents(events)
    padded32 = pad_constituents(constituents, events.Jet)
    pn_padded32 = int(sum(array.nbytes for array in padded32.values()))
    per_jet = ak.to_numpy(ak.flatten(ak.num(constituents, axis=2))).astype(np.int64)
    kept = np.minimum(per_jet, PARTICLENET_MAX_CONSTITUENTS)
    pn_row_bytes = PN_VALUES * FLOAT
    pn_ragged = ragged_bytes_sent("constituents", np.zeros((int(per_jet.sum()), PN_VALUES),
                                                           np.float32), per_jet, cap)
    pn_ragged32 = ragged_bytes_sent("constituents32", np.zeros((int(kept.sum()), PN_VALUES),
                                                               np.float32), kept, cap)
    pn_padded_max = len(per_jet) * int(per_jet.max()) * (pn_row_bytes + FLOAT)

    result = {
        "what": "bytes sent: ragged requests vs padded tensors (benchmarks/ragged_bytes.py)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"host": platform.node(), "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine()},
        "sample": {"events_per_dataset": args.events, "datasets": sorted(fileset),
                   "seed": args.seed, "max_request_bytes": cap},
        "pf_candidates_per_event": {
            "values_per_row": list(PF_FIELDS), "multiplicity": multiplicity(per_event),
            "ragged_bytes": pf_ragged["bytes"], "ragged_requests": pf_ragged["requests"],
            "padded_to_sample_max_bytes": pf_padded_max,
            "padded_to_request_max_bytes": pf_padded_groups,
            "saving_vs_sample_max_pct": saving(pf_ragged["bytes"], pf_padded_max),
            "saving_vs_request_max_pct": saving(pf_ragged["bytes"], pf_padded_groups),
        },
        "constituents_per_jet": {
            "values_per_row": PN_VALUES, "multiplicity": multiplicity(per_jet),
            "constituents_beyond_32_dropped_by_padding": int((per_jet - kept).sum()),
            "particlenet_lite_padded_32_bytes": pn_padded32,
            "padded_to_sample_max_bytes": pn_padded_max,
            "ragged_bytes": pn_ragged["bytes"], "ragged_requests": pn_ragged["requests"],
            "ragged_truncated_32_bytes": pn_ragged32["bytes"],
            "saving_vs_padded_32_pct": saving(pn_ragged["bytes"], pn_padded32),
            "saving_truncated_32_vs_padded_32_pct": saving(pn_ragged32["bytes"], pn_padded32),
            "saving_vs_sample_max_pct": saving(pn_ragged["bytes"], pn_padded_max),
        },
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    pf, pn = result["pf_candidates_per_event"], result["constituents_per_jet"]
    logger.info("PF candidates per event (%d events, mean %.1f, max %d): ragged %d B vs padded to "
                "the sample max %d B (%.1f %% fewer), to each request's max %d B (%.1f %% fewer)",
                pf["multiplicity"]["entries"], pf["multiplicity"]["mean"],
                pf["multiplicity"]["max"], pf["ragged_bytes"], pf_padded_max,
                pf["saving_vs_sample_max_pct"], pf_padded_groups, pf["saving_vs_request_max_pct"])
    logger.info("constituents per jet (%d jets, mean %.1f, max %d): ragged %d B vs "
                "particlenet_lite's padded-to-32 %d B (%.1f %% fewer; truncated to 32 as well: "
                "%.1f %% fewer), vs padded to the max %d B (%.1f %% fewer)",
                pn["multiplicity"]["entries"], pn["multiplicity"]["mean"],
                pn["multiplicity"]["max"], pn["ragged_bytes"], pn_padded32,
                pn["saving_vs_padded_32_pct"], pn["saving_truncated_32_vs_padded_32_pct"],
                pn_padded_max, pn["saving_vs_sample_max_pct"])
    logger.info("wrote %s", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
