"""Example analysis: the IRIS-HEP Analysis Grand Challenge's ML step, served through Triton.

The selection, regions, systematics and the parity rule: docs/internals/examples.md (with an
example).
"""

from __future__ import annotations

import logging
import zlib
from typing import Any, Mapping

import awkward as ak
import hist
import numpy as np
from coffea import processor

from ..processor import SonicMixin
from .agc_features import BIN_HIGH, BIN_LOW, FEATURE_NAMES, MAX_N_JETS, features_from_arrays

__all__ = ["AgcProcessor", "MODEL_NAME", "VERSION_FOR_EVEN", "VERSION_FOR_ODD", "agc_features",
           "select"]

logger = logging.getLogger(__name__)

MODEL_NAME = "reconstruction_bdt_xgb"
#: even events are scored by the model trained on odd events, and odd ones the other way
VERSION_FOR_EVEN, VERSION_FOR_ODD = 1, 2
B_TAG_THRESHOLD = 0.5
JET_KINEMATIC_SYSTEMATICS = ("pt_scale_up", "pt_res_up")
_JET_FIELDS = ("pt", "eta", "phi", "mass", "btagCSVV2", "qgl")
_LOCAL_BOOSTERS: dict[str, Any] = {}


def select(events: ak.Array, jets: ak.Array) -> dict[str, Any]:
    """The AGC's objects and region masks for ``jets`` (the nominal or a varied copy)."""
    elecs, muons = events.Electron, events.Muon
    elecs = elecs[(elecs.pt > 30) & (np.abs(elecs.eta) < 2.1) & (elecs.cutBased == 4)
                  & (elecs.sip3d < 4)]
    muons = muons[(muons.pt > 30) & (np.abs(muons.eta) < 2.1) & muons.tightId
                  & (muons.sip3d < 4) & (muons.pfRelIso04_all < 0.15)]
    jets = jets[(jets.pt > 30) & (np.abs(jets.eta) < 2.4) & jets.isTightLeptonVeto]
    one_lepton = (ak.num(elecs) + ak.num(muons)) == 1
    four_jets = ak.num(jets) >= 4
    n_btag = ak.sum(jets.btagCSVV2 > B_TAG_THRESHOLD, axis=1)
    return {"jets": jets, "electrons": elecs, "muons": muons,
            "4j1b": ak.to_numpy(one_lepton & four_jets & (n_btag == 1)),
            "4j2b": ak.to_numpy(one_lepton & four_jets & (n_btag >= 2))}


def agc_features(jets: ak.Array, electrons: ak.Array,
                 muons: ak.Array) -> tuple[np.ndarray, np.ndarray]:
    """The 20 features of every permutation of events with >= 4 jets and one lepton: ``(rows
    [n, 20] float32, permutations per event)``."""
    leading = {field: ak.to_numpy(ak.fill_none(ak.pad_none(
        jets[field], MAX_N_JETS, clip=True), 0.0)).astype(np.float64) for field in _JET_FIELDS}
    lepton_fields = ("pt", "eta", "phi", "mass")
    lepton = {field: ak.to_numpy(ak.flatten(ak.concatenate(
        [electrons[field], muons[field]], axis=1))).astype(np.float64) for field in lepton_fields}
    return features_from_arrays(leading, lepton, ak.to_numpy(ak.num(jets)))


def _hist(low: float, high: float, label: str) -> hist.Hist:
    return (hist.Hist.new.Reg(25, low, high, name="observable", label=label)
            .StrCat([], name="process", label="Process", growth=True)
            .StrCat([], name="variation", label="Systematic variation", growth=True)
            .Weight())


class AgcProcessor(SonicMixin, processor.ProcessorABC):
    """The AGC's histograms (``hist_dict`` per region, ``ml_hist_dict`` per feature) with the
    jet-parton assignment BDT served (``server``: ``triton+grpc://host:port``) or run locally
    (``local_models``). ``systematics``: run the AGC's variations (default True)."""

    sonic_inputs = {name: {"input__0": ("float32", (len(FEATURE_NAMES),))}
                    for name in ("bdt_v1", "bdt_v2")}

    def __init__(self, server: str = "triton+grpc://127.0.0.1:8001", *,
                 local_models: Mapping[int, str] | None = None, systematics: bool = True,
                 **model_options: Any) -> None:
        base = server.rstrip("/")
        self.local_models = ({int(v): str(p) for v, p in local_models.items()}
                             if local_models is not None else None)
        models = {} if self.local_models else {
            f"bdt_v{v}": f"{base}/{MODEL_NAME}/{v}" for v in (VERSION_FOR_EVEN, VERSION_FOR_ODD)}
        self.sonic_configure(models, **model_options)
        self.systematics = systematics

    # -- inference ------------------------------------------------------------------------
    def score(self, rows: np.ndarray, even: np.ndarray) -> np.ndarray:
        """The BDT's probability that each row is the right permutation, each row scored by the
        version of its event's parity (``even``: per row)."""
        result = np.zeros(len(rows), dtype=np.float32)
        parts = {VERSION_FOR_EVEN: even, VERSION_FOR_ODD: ~even}
        if self.local_models:
            for version, mask in parts.items():
                if mask.any():
                    result[mask] = _booster(self.local_models[version]).inplace_predict(rows[mask])
            return result
        pending = {version: self.infer_async(f"bdt_v{version}", {"input__0": rows[mask]})
                   for version, mask in parts.items() if mask.any()}
        for version, handle in pending.items():
            result[parts[version]] = handle.result()["output__0"][:, 1]
        return result

    def best_features(self, selected: Mapping[str, Any], mask: np.ndarray,
                      even: np.ndarray) -> np.ndarray:
        """The features of each selected event's best-scored permutation ``[events, 20]``."""
        rows, counts = agc_features(selected["jets"][mask], selected["electrons"][mask],
                                    selected["muons"][mask])
        scores = self.score(rows, np.repeat(even[mask], counts))
        best = ak.to_numpy(ak.argmax(ak.unflatten(scores, counts), axis=1))
        starts = np.cumsum(counts) - counts
        return rows[starts + best]

    # -- per chunk --------------------------------------------------------------------------
    def _varied_jets(self, events: ak.Array, variation: str) -> ak.Array:
        jets = events.Jet
        if variation == "pt_scale_up":
            jets = ak.with_field(jets, jets.pt * 1.03, "pt")
        elif variation == "pt_res_up":
            # the AGC draws N(1, 0.05) per jet; seeded by the chunk here, so that reruns agree
            metadata = getattr(events, "metadata", {}) or {}
            seed = [zlib.crc32(str(metadata.get("filename", "")).encode()),
                    int(metadata.get("entrystart", 0))]
            flat = ak.flatten(jets.pt)
            factor = np.random.default_rng(seed).normal(1.0, 0.05, len(flat))
            jets = ak.with_field(jets, ak.unflatten(ak.to_numpy(flat) * factor,
                                                    ak.num(jets.pt)), "pt")
        return jets

    def process(self, events: ak.Array) -> dict[str, Any]:
        metadata = getattr(events, "metadata", {}) or {}
        dataset = metadata.get("dataset", "unknown")
        process_name = metadata.get("process", dataset)
        hist_dict = {"4j1b": _hist(50, 550, "observable [GeV]"),
                     "4j2b": _hist(50, 550, "observable [GeV]")}
        ml_hist_dict = {name: _hist(BIN_LOW[i], BIN_HIGH[i], name)
                        for i, name in enumerate(FEATURE_NAMES)}
        variations = ["nominal"]
        event_systematics: list[str] = []
        if self.systematics and metadata.get("variation", "nominal") == "nominal":
            event_systematics = [f"btag_var_{i}" for i in range(4)]
            if process_name == "wjets":
                event_systematics.append("scale_var")
            variations += [*JET_KINEMATIC_SYSTEMATICS, *event_systematics]
        even = ak.to_numpy(events.event % 2 == 0)
        passed = {"4j1b": 0, "4j2b": 0}
        for variation in variations:
            jets = self._varied_jets(events, variation)
            selected = select(events, jets)
            for region in ("4j1b", "4j2b"):
                mask = selected[region]
                region_jets = selected["jets"][mask]
                weights = np.ones(int(mask.sum()))
                if variation == "nominal":
                    passed[region] = int(mask.sum())
                features = None
                if region == "4j1b":
                    observable = ak.to_numpy(ak.sum(region_jets.pt, axis=-1))
                else:
                    if not mask.any():
                        continue
                    observable = _trijet_mass(region_jets)
                    features = self.best_features(selected, mask, even)
                fills = [(variation if variation not in event_systematics
                          else None, weights)]
                if variation in event_systematics:
                    fills = [(f"{variation}_{direction}",
                              weights * _weight_variation(variation, direction, region_jets))
                             for direction in ("up", "down")]
                elif variation == "nominal" and metadata.get("variation", "nominal") != "nominal":
                    fills = [(metadata["variation"], weights)]
                for name, weight in fills:
                    hist_dict[region].fill(observable=observable, process=process_name,
                                           variation=name, weight=weight)
                    if features is not None:
                        for i, feature in enumerate(FEATURE_NAMES):
                            ml_hist_dict[feature].fill(observable=features[:, i],
                                                       process=process_name, variation=name,
                                                       weight=weight)
        output: dict[str, Any] = {
            "nevents": {dataset: len(events)},
            "selected": {dataset: passed},
            "hist_dict": hist_dict, "ml_hist_dict": ml_hist_dict}
        if not self.local_models:
            output["inference"] = self.sonic_stats()
        return output

    def postprocess(self, accumulator: dict[str, Any]) -> dict[str, Any]:
        return accumulator


def _trijet_mass(jets: ak.Array) -> np.ndarray:
    """The AGC's 4j2b observable: mass of the highest-pt trijet with a b-tagged jet."""
    trijet = ak.combinations(jets, 3, fields=["j1", "j2", "j3"])
    p4 = trijet.j1 + trijet.j2 + trijet.j3
    max_btag = np.maximum(trijet.j1.btagCSVV2,
                          np.maximum(trijet.j2.btagCSVV2, trijet.j3.btagCSVV2))
    p4 = p4[max_btag > B_TAG_THRESHOLD]
    return ak.to_numpy(ak.flatten(p4[ak.argmax(p4.pt, axis=1, keepdims=True)].mass))


def _weight_variation(name: str, direction: str, jets: ak.Array) -> np.ndarray:
    """The AGC's corrections.json ``event_systematics``: ``btag_var_i`` is 1 +- 0.075 pt_i / 50
    of jet i; ``scale_var`` is 1 +- 0.025."""
    sign = 1.0 if direction == "up" else -1.0
    if name == "scale_var":
        return np.full(len(jets), 1.0 + sign * 0.025)
    pt = ak.to_numpy(jets.pt[:, int(name.rsplit("_", 1)[-1])]).astype(np.float64)
    return 1.0 + sign * pt * 0.075 / 50


def _booster(path: str) -> Any:
    import xgboost

    booster = _LOCAL_BOOSTERS.get(path)
    if booster is None:
        booster = _LOCAL_BOOSTERS[path] = xgboost.Booster(model_file=path)
    return booster
