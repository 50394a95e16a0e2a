"""Example analysis: tag every jet with a served model and histogram the scores per dataset.

What it computes and where it runs, with an example: docs/internals/examples.md.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import awkward as ak
import hist
import numpy as np
from coffea import processor

from .. import columns
from ..zoo.inputs import pad_constituents
from ..processor import SonicMixin

logger = logging.getLogger(__name__)

#: jet flavour categories of the histograms (``-1``: not simulated / unknown)
FLAVOURS = (-1, 0, 4, 5)
#: b-score threshold of the "b-tagged jets per event" histogram
B_TAG_THRESHOLD = 0.5
#: The trained zoo models ``physics=True`` adds.
PHYSICS_MODELS = ("particlenet", "deepmet")


def _is_dask(array: Any) -> bool:
    return type(array).__module__.startswith("dask_awkward")


def _count(value: Any) -> Any:
    """A plain int for eager counts (they add up cleanly), the lazy scalar for dask."""
    return value if _is_dask(value) else int(value)


class JetTaggingProcessor(SonicMixin, processor.ProcessorABC):
    """Histograms of served jet-tagger scores per dataset and jet flavour.

    ``server`` is ``triton+grpc://host:port`` (models are appended) or a mapping
    ``{model: url}``. ``use_constituents``: ``"auto"`` (when the PF branches exist), True, False.
    """

    #: what process() sends jet_tagger (checked against the served model before a run)
    sonic_inputs = {"jet_tagger": {"features": ("float32", (len(columns.DEFAULT_JET_FIELDS),))}}

    def __init__(self, server: str | Mapping[str, str] = "triton+grpc://127.0.0.1:8001", *,
                 jet_pt_min: float = 15.0, use_constituents: bool | str = "auto",
                 physics: bool = False, **model_options: Any) -> None:
        # The trained particlenet replaces the untrained particlenet_lite in physics mode.
        names = ("jet_tagger",) + (PHYSICS_MODELS if physics else ("particlenet_lite",))
        if isinstance(server, str):
            base = server.rstrip("/")
            models = {name: f"{base}/{name}" for name in names}
        else:
            models = dict(server)
        self.sonic_configure(models, **model_options)
        if use_constituents is not True:  # called only where the files have PF candidates
            self.sonic_optional = frozenset(models) - {"jet_tagger"}
        self.jet_pt_min = jet_pt_min
        self.use_constituents = use_constituents
        self.physics = physics

    # -- per chunk (or per dask partition) --------------------------------------------------
    def _wants_constituents(self, events: ak.Array) -> bool:
        if self.use_constituents == "auto":
            return all(name in ak.fields(events) for name in ("PFCands", "JetPFCands"))
        return bool(self.use_constituents)

    def tag_jets(self, events: ak.Array) -> ak.Array:
        """Per event: selected jets with ``b_score``, ``flavour``, ``pt``, and the leading jet's
        ParticleNet b score (``leading_pn_b``, empty when not run)."""
        selected = events.Jet.pt > self.jet_pt_min
        jets = events.Jet[selected]
        pending = self.infer_async("jet_tagger", {"features": columns.jet_features(jets)}, like=jets)
        # CPU work below overlaps the jet_tagger request in flight.
        leading = jets[:, :1]
        if self._wants_constituents(events) and not self.physics:
            constituents = columns.jet_constituents(events)[selected][:, :1]
            pn_inputs = pad_constituents(constituents, leading)
            leading_pn_b = self.infer("particlenet_lite", pn_inputs, like=leading)["probs"][:, :, 0]
        else:
            leading_pn_b = ak.values_astype(leading.pt[:, :0], np.float32)
        if "hadronFlavour" in ak.fields(jets):
            flavour = ak.values_astype(jets.hadronFlavour, np.int32)
        else:
            flavour = ak.values_astype(ak.zeros_like(jets.pt), np.int32) - 1
        fields: dict[str, Any] = {}
        if self.physics:
            fields = self._physics(events, jets, selected)
        b_score = pending.result()["probs"][:, :, 0]
        per_jet = ak.zip({"b_score": b_score, "flavour": flavour, "pt": jets.pt})
        if "pn_b" in fields:
            per_jet = ak.with_field(per_jet, fields.pop("pn_b"), "pn_b")
        return ak.zip({"jets": per_jet, "leading_pn_b": leading_pn_b, **fields}, depth_limit=1)

    def _physics(self, events: ak.Array, jets: ak.Array, selected: ak.Array) -> dict[str, Any]:
        """The trained models: particlenet b score per selected jet; deepmet, PF and true MET
        (px, py) per event where the branches exist."""
        from ..zoo.physics import deepmet_inputs, met_vector

        if columns.is_typetracer(events):
            raise NotImplementedError(
                "JetTaggingProcessor(physics=True) runs on eager chunks (processor.Runner), "
                "not under dask-awkward")
        fields: dict[str, Any] = {}
        if self._wants_constituents(events):
            constituents = columns.jet_constituents(events)[selected]
            inputs = pad_constituents(constituents, jets)
            fields["pn_b"] = self.infer("particlenet", inputs, like=jets)["probs"][:, :, 0]
        if "PFCands" in ak.fields(events) and "fromPV" in ak.fields(events.PFCands):
            met = self.infer("deepmet", deepmet_inputs(events.PFCands))["met"]
            fields["deepmet_px"], fields["deepmet_py"] = met[:, 0], met[:, 1]
            for name in ("MET", "GenMET"):
                if name in ak.fields(events):
                    vector = met_vector(ak.to_numpy(events[name].pt), ak.to_numpy(events[name].phi))
                    fields[f"{name.lower()}_px"], fields[f"{name.lower()}_py"] = vector.T
        return fields

    def process(self, events: ak.Array) -> dict[str, Any]:
        dataset = events.metadata.get("dataset", "unknown")
        tagged = self.sonic_map(self.tag_jets, events, label="tag_jets")
        if _is_dask(tagged):
            import hist.dask as dask_hist

            histogram = dask_hist.Hist
        else:
            histogram = hist.Hist
        dataset_axis = hist.axis.StrCategory([], growth=True, name="dataset")
        flavour_axis = hist.axis.IntCategory(list(FLAVOURS), name="flavour", label="hadron flavour")
        b_score = histogram(dataset_axis, flavour_axis,
                            hist.axis.Regular(50, 0, 1, name="score", label="jet_tagger b score"))
        pn_score = histogram(dataset_axis,
                             hist.axis.Regular(50, 0, 1, name="score", label="particlenet_lite b score"))
        n_btag = histogram(dataset_axis, hist.axis.Integer(0, 8, name="n", label="b-tagged jets"))
        jets = ak.flatten(tagged.jets)
        b_score.fill(dataset=dataset, flavour=jets.flavour, score=jets.b_score)
        pn_score.fill(dataset=dataset, score=ak.flatten(tagged.leading_pn_b))
        n_btag.fill(dataset=dataset, n=ak.sum(tagged.jets.b_score > B_TAG_THRESHOLD, axis=1))
        histograms = {"b_score": b_score, "particlenet_b": pn_score, "n_btag": n_btag}
        if self.physics:
            histograms.update(self._physics_histograms(tagged, jets, dataset, dataset_axis,
                                                       flavour_axis))
        output: dict[str, Any] = {
            "histograms": histograms,
            "cutflow": {dataset: {"events": _count(ak.num(events, axis=0)),
                                  "jets": _count(ak.num(jets, axis=0))}},
        }
        if not _is_dask(tagged):
            output["inference"] = self.sonic_stats()
            output["provenance"] = self.sonic_provenance()
        return output

    @staticmethod
    def _physics_histograms(tagged: ak.Array, jets: ak.Array, dataset: str, dataset_axis: Any,
                            flavour_axis: Any) -> dict[str, Any]:
        trained = hist.Hist(dataset_axis, flavour_axis,
                            hist.axis.Regular(50, 0, 1, name="score", label="particlenet b score"))
        if "pn_b" in ak.fields(jets):
            trained.fill(dataset=dataset, flavour=jets.flavour, score=jets.pn_b)
        residual = hist.Hist(dataset_axis,
                             hist.axis.StrCategory(["deepmet", "PF MET"], name="method"),
                             hist.axis.Regular(80, -40, 40, name="residual",
                                               label="MET x, y residual vs GenMET [GeV]"))
        if "genmet_px" in ak.fields(tagged) and "met_px" in ak.fields(tagged):
            for method, prefix in (("deepmet", "deepmet"), ("PF MET", "met")):
                for axis_name in ("px", "py"):
                    values = np.asarray(tagged[f"{prefix}_{axis_name}"]) - np.asarray(
                        tagged[f"genmet_{axis_name}"])
                    residual.fill(dataset=dataset, method=method, residual=values)
        return {"particlenet": trained, "met_residual": residual}

    def postprocess(self, accumulator: dict[str, Any]) -> dict[str, Any]:
        return accumulator


def _panels(histograms: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(title, [(label, histogram), ...])`` of every panel with something to show."""
    b_score = histograms["b_score"]
    flavour_names = {0: "light (udsg)", 4: "c", 5: "b"}
    by_flavour = b_score[{"dataset": sum}]
    known = [f for f in (5, 4, 0) if by_flavour[{"flavour": hist.loc(f)}].sum() > 0]
    panels: list[tuple[str, Any]] = []
    if known:
        panels.append(("jet_tagger b score by true jet flavour",
                       [(flavour_names[f], by_flavour[{"flavour": hist.loc(f)}]) for f in known]))
    per_dataset = b_score[{"flavour": sum}]
    panels.append(("jet_tagger b score per dataset (all selected jets)",
                   [(d, per_dataset[{"dataset": d}]) for d in per_dataset.axes["dataset"]]))
    n_btag = histograms["n_btag"]
    panels.append((f"jets with b score > {B_TAG_THRESHOLD} per event",
                   [(d, n_btag[{"dataset": d}]) for d in n_btag.axes["dataset"]]))
    trained = histograms.get("particlenet")
    if trained is not None and trained.sum() > 0:
        by_flavour = trained[{"dataset": sum}]
        panels.append(("particlenet (trained) b score by true jet flavour, all selected jets",
                       [(flavour_names[f], by_flavour[{"flavour": hist.loc(f)}])
                        for f in (5, 4, 0) if by_flavour[{"flavour": hist.loc(f)}].sum() > 0]))
    residual = histograms.get("met_residual")
    if residual is not None and residual.sum() > 0:
        summed = residual[{"dataset": sum}]
        curves = []
        for method in ("deepmet", "PF MET"):
            one = summed[{"method": method}]
            centres, counts = one.axes[0].centers, one.values()
            rms = float(np.sqrt(np.sum(counts * centres ** 2) / max(counts.sum(), 1)))
            curves.append((f"{method} (RMS {rms:.1f} GeV)", one))
        panels.append(("MET (px, py) - GenMET: deepmet vs PF MET", curves))
    particlenet = histograms["particlenet_b"]
    if particlenet.sum() > 0:
        panels.append(("particlenet_lite b score, leading jet (untrained)",
                       [(d, particlenet[{"dataset": d}]) for d in particlenet.axes["dataset"]]))
    return panels


def plot_scores(output: Mapping[str, Any], path: str) -> str:
    """Save the score distributions per dataset (normalised) as a PNG; return its path.

    >>> plot_scores  # doctest: +ELLIPSIS
    <function plot_scores at ...>
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mplhep

    plt.style.use(mplhep.style.CMS)
    panels = _panels(output["histograms"])
    columns_count = 2 if len(panels) > 2 else len(panels)
    rows_count = (len(panels) + columns_count - 1) // columns_count
    figure, axes = plt.subplots(rows_count, columns_count, figsize=(9 * columns_count, 7 * rows_count),
                                squeeze=False)
    for axis, (title, curves) in zip(axes.flat, panels):
        for label, histogram in curves:
            if histogram.sum() > 0:
                mplhep.histplot(histogram, ax=axis, density=True, label=label, histtype="step",
                                linewidth=2)
        axis.set_title(title, fontsize=18)
        axis.set_ylabel("normalised")
        axis.set_yscale("log")
        axis.legend(fontsize=16)
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path
