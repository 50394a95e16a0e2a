"""Declarations of the zoo models: names, dtypes and per-row dims of every input and output
(docs/internals/zoo.md, with an example).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.tensors import NamedTensors, TensorInfo, triton_dtype

#: NanoAOD ``Jet`` fields the per-jet tagger reads, in this order (all exist in NanoAOD v9 and later).
JET_TAGGER_FEATURES: tuple[str, ...] = ("pt", "eta", "phi", "mass", "btagDeepFlavB", "nConstituents")
#: Class order of the taggers' probability outputs (``Jet_hadronFlavour`` 5, 4, 0).
JET_CLASSES: tuple[str, ...] = ("b", "c", "light")
#: Constituents per jet the ParticleNet-like model sees (zero-padded, masked).
PARTICLENET_MAX_CONSTITUENTS = 32
#: Per-constituent features of particlenet_lite, in this order.
PARTICLENET_FEATURES: tuple[str, ...] = (
    "log_pt", "log_e", "log_pt_rel", "log_e_rel", "deta", "dphi", "charge",
)
#: PF candidates per event the DeepMET-like regression sees (highest-pt ones, zero-padded, masked).
DEEPMET_MAX_CANDIDATES = 160
#: Continuous per-candidate features of deepmet, in this order (``pf_cont``).
DEEPMET_FEATURES: tuple[str, ...] = ("px", "py", "log_pt", "eta")
#: Classes of deepmet's categorical input ``pf_class`` (0 is padding), from pdgId and fromPV;
#: sent as float32 indices like every zoo input, embedded inside the model.
DEEPMET_CLASSES: tuple[str, ...] = (
    "padding", "charged_hadron_pv", "charged_hadron_pileup", "electron", "muon", "photon",
    "neutral_hadron",
)
#: Side of the ProtoDUNE wire-plane patch the EmTrkMichelId CNN classifies.
EMTRK_PATCH = 48


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor of a model: numpy dtype name and per-row dims (batch dimension excluded).

    >>> TensorSpec("x", "float32", (16,)).info
    TensorInfo(name='x', datatype='FP32', dims=(16,))
    """

    name: str
    dtype: str
    dims: tuple[int, ...]

    @property
    def info(self) -> TensorInfo:
        """This tensor as servers declare it (Triton datatype, per-row dims)."""
        return TensorInfo(self.name, triton_dtype(self.dtype), tuple(self.dims))


@dataclass(frozen=True)
class ModelSpec(NamedTensors):
    """Everything the repository writer and clients need to know about a zoo model.

    >>> MODEL_SPECS["emtrk_cnn"].output_names
    ('em_trk_none', 'michel')
    """

    name: str
    description: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_microseconds: int = 100
    #: Ships as package data (small, trained) or is generated on first use and cached (large).
    shipped: bool = True
    extra: dict = field(default_factory=dict, compare=False)


#: The CMS ParticleNet layout, shared by particlenet_lite (untrained) and particlenet (trained).
_PARTICLENET_TENSORS: dict = dict(
    inputs=(
        TensorSpec("pf_points", "float32", (2, PARTICLENET_MAX_CONSTITUENTS)),
        TensorSpec("pf_features", "float32",
                   (len(PARTICLENET_FEATURES), PARTICLENET_MAX_CONSTITUENTS)),
        TensorSpec("pf_mask", "float32", (1, PARTICLENET_MAX_CONSTITUENTS)),
    ),
    outputs=(TensorSpec("probs", "float32", (len(JET_CLASSES),)),),
    max_batch_size=4096,
    preferred_batch_sizes=(512, 2048),
)

MODEL_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="jet_tagger",
            description="Per-jet MLP b/c/light tagger on NanoAOD Jet features "
            + ", ".join(JET_TAGGER_FEATURES),
            inputs=(TensorSpec("features", "float32", (len(JET_TAGGER_FEATURES),)),),
            outputs=(TensorSpec("probs", "float32", (len(JET_CLASSES),)),),
            max_batch_size=65536,
            preferred_batch_sizes=(4096, 16384),
        ),
        ModelSpec(
            name="particlenet_lite",
            description="ParticleNet-like EdgeConv tagger over up to "
            f"{PARTICLENET_MAX_CONSTITUENTS} PF constituents per jet (CMS input layout)",
            **_PARTICLENET_TENSORS,
        ),
        ModelSpec(
            name="particlenet",
            description="ParticleNet-like EdgeConv b/c/light tagger over up to "
            f"{PARTICLENET_MAX_CONSTITUENTS} PF constituents per jet (CMS input layout), "
            "trained here on the synthetic PFNano-like sample",
            **_PARTICLENET_TENSORS,
        ),
        ModelSpec(
            name="deepmet",
            description="DeepMET-like regression: up to "
            f"{DEEPMET_MAX_CANDIDATES} PF candidates per event (continuous features + a "
            "pdgId/fromPV class embedding) -> per-candidate weights -> MET (px, py); trained here",
            inputs=(
                TensorSpec("pf_cont", "float32", (DEEPMET_MAX_CANDIDATES, len(DEEPMET_FEATURES))),
                # class indices as float32 (every zoo input is FP32); the model casts them
                TensorSpec("pf_class", "float32", (DEEPMET_MAX_CANDIDATES,)),
            ),
            outputs=(TensorSpec("met", "float32", (2,)),
                     TensorSpec("weights", "float32", (DEEPMET_MAX_CANDIDATES,))),
            max_batch_size=4096,
            preferred_batch_sizes=(256, 1024),
        ),
        ModelSpec(
            name="emtrk_cnn",
            description="ProtoDUNE EmTrkMichelId CNN on 48x48 wire-plane patches "
            "(3-class em/track/none softmax + Michel-electron sigmoid, ~11.9 M parameters)",
            inputs=(TensorSpec("patch", "float32", (1, EMTRK_PATCH, EMTRK_PATCH)),),
            outputs=(
                TensorSpec("em_trk_none", "float32", (3,)),
                TensorSpec("michel", "float32", (1,)),
            ),
            max_batch_size=4096,
            preferred_batch_sizes=(256, 2048),
            shipped=False,
        ),
    )
}
