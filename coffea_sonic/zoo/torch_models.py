"""Torch definitions of the zoo models (needs the ``torch`` extra); seeded numpy weights.

>>> import torch
>>> from coffea_sonic.zoo.torch_models import build
>>> build("jet_tagger")(torch.zeros(2, 6)).shape
torch.Size([2, 3])
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ModelNotFoundError, require
from .spec import (DEEPMET_CLASSES, DEEPMET_FEATURES, EMTRK_PATCH, JET_CLASSES,
                   JET_TAGGER_FEATURES, PARTICLENET_FEATURES)

torch = require("torch", "coffea_sonic.zoo.torch_models")
nn = torch.nn

#: Seed of every zoo model's initial weights.
WEIGHT_SEED = 20240917


class JetTagger(nn.Module):
    """Per-jet MLP: NanoAOD Jet features -> (b, c, light) probabilities.

    The input scaling lives inside the network so that the served model takes raw NanoAOD values.
    """

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        n_in, n_out = len(JET_TAGGER_FEATURES), len(JET_CLASSES)
        self.net = nn.Sequential(
            nn.Linear(n_in, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, n_out),
        )

    def scale(self, features: "torch.Tensor") -> "torch.Tensor":
        pt, eta, phi, mass, btag, n_const = features.unbind(dim=1)
        return torch.stack([
            torch.log(torch.clamp(pt, min=1.0)) - 3.5,
            eta / 2.5,
            phi / math.pi,
            torch.log(torch.clamp(mass, min=0.0) + 1.0) - 2.0,
            btag * 2.0 - 1.0,
            n_const / 20.0 - 1.0,
        ], dim=1)

    def logits(self, features: "torch.Tensor") -> "torch.Tensor":
        return self.net(self.scale(features))

    def forward(self, features: "torch.Tensor") -> "torch.Tensor":
        return torch.softmax(self.logits(features), dim=1)


class EdgeConv(nn.Module):
    """EdgeConv block of ParticleNet: k nearest neighbours in ``points``, shared MLP on edges."""

    def __init__(self, k: int, in_features: int, widths: tuple[int, ...]) -> None:
        super().__init__()
        self.k = k
        layers: list[nn.Module] = []
        previous = 2 * in_features
        for width in widths:
            layers += [nn.Conv2d(previous, width, kernel_size=1), nn.ReLU()]
            previous = width
        self.mlp = nn.Sequential(*layers)
        self.shortcut = nn.Conv1d(in_features, widths[-1], kernel_size=1)

    def forward(self, points: "torch.Tensor", features: "torch.Tensor") -> "torch.Tensor":
        # points [N, D, P], features [N, C, P]
        n_rows, n_channels, n_points = features.shape
        inner = -2 * torch.matmul(points.transpose(2, 1), points)
        square = torch.sum(points * points, dim=1, keepdim=True)
        distance = square.transpose(2, 1) + inner + square  # [N, P, P]
        neighbours = (-distance).topk(self.k + 1, dim=-1)[1][:, :, 1:]  # [N, P, k], drop self
        index = neighbours.reshape(n_rows, 1, n_points * self.k).expand(n_rows, n_channels, -1)
        gathered = torch.gather(features, 2, index).reshape(n_rows, n_channels, n_points, self.k)
        centre = features.unsqueeze(3).expand(-1, -1, -1, self.k)
        edges = torch.cat([centre, gathered - centre], dim=1)  # [N, 2C, P, k]
        return torch.relu(self.mlp(edges).mean(dim=3) + self.shortcut(features))


class ParticleNetLite(nn.Module):
    """ParticleNet-like constituent tagger with the CMS input layout.

    Inputs ``pf_points [N,2,P]`` (deta, dphi), ``pf_features [N,F,P]``, ``pf_mask [N,1,P]``.
    """

    def __init__(self, k: int = 8) -> None:
        super().__init__()
        n_features = len(PARTICLENET_FEATURES)
        self.input_scale = nn.Conv1d(n_features, n_features, kernel_size=1)
        self.edge1 = EdgeConv(k, n_features, (32, 32, 32))
        self.edge2 = EdgeConv(k, 32, (64, 64, 64))
        self.head = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, len(JET_CLASSES)))

    def forward(self, pf_points: "torch.Tensor", pf_features: "torch.Tensor",
                pf_mask: "torch.Tensor") -> "torch.Tensor":
        # Padded constituents are pushed far away so they are nobody's neighbour.
        shift = (1.0 - pf_mask) * 1e4
        points = pf_points + shift
        features = self.input_scale(pf_features) * pf_mask
        features = self.edge1(points, features) * pf_mask
        features = self.edge2(features + shift, features) * pf_mask
        counts = torch.clamp(pf_mask.sum(dim=2), min=1.0)  # [N, 1]
        pooled = features.sum(dim=2) / counts
        return torch.softmax(self.head(pooled), dim=1)


class ParticleNet(nn.Module):
    """The trained ParticleNet-like tagger: ParticleNetLite's input layout, two smaller EdgeConv
    blocks (fast to train on a CPU) and a fixed (not trained) affine input scaling.

    ``pf_features`` arrive raw (as :func:`coffea_sonic.zoo.inputs.pad_constituents` builds them);
    ``logits`` gives the pre-softmax scores for training.
    """

    #: Per-feature (offset, scale) of PARTICLENET_FEATURES: log_pt, log_e, log_pt_rel, log_e_rel,
    #: deta, dphi, charge.
    FEATURE_OFFSET = (1.0, 1.5, -2.5, -2.5, 0.0, 0.0, 0.0)
    FEATURE_SCALE = (1.0, 1.0, 1.0, 1.0, 10.0, 10.0, 1.0)

    def __init__(self, k: int = 6) -> None:
        super().__init__()
        n_features = len(PARTICLENET_FEATURES)
        self.register_buffer("offset", torch.tensor(self.FEATURE_OFFSET).reshape(1, -1, 1),
                             persistent=False)
        self.register_buffer("scale", torch.tensor(self.FEATURE_SCALE).reshape(1, -1, 1),
                             persistent=False)
        self.input_scale = nn.Conv1d(n_features, n_features, kernel_size=1)
        self.edge1 = EdgeConv(k, n_features, (24, 24))
        self.edge2 = EdgeConv(k, 24, (32, 32))
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, len(JET_CLASSES)))

    def logits(self, pf_points: "torch.Tensor", pf_features: "torch.Tensor",
               pf_mask: "torch.Tensor") -> "torch.Tensor":
        shift = (1.0 - pf_mask) * 1e4
        points = pf_points + shift
        features = self.input_scale((pf_features - self.offset) * self.scale) * pf_mask
        features = self.edge1(points, features) * pf_mask
        features = self.edge2(features + shift, features) * pf_mask
        counts = torch.clamp(pf_mask.sum(dim=2), min=1.0)
        # Mean and max pooling over real constituents (padding set far below any activation).
        pooled_max = (features - (1.0 - pf_mask) * 1e4).max(dim=2)[0]
        return self.head(torch.cat([features.sum(dim=2) / counts, pooled_max], dim=1))

    def forward(self, pf_points: "torch.Tensor", pf_features: "torch.Tensor",
                pf_mask: "torch.Tensor") -> "torch.Tensor":
        return torch.softmax(self.logits(pf_points, pf_features, pf_mask), dim=1)


class DeepMET(nn.Module):
    """DeepMET-like per-candidate weights: ``met = -sum_i w_i (px_i, py_i)`` over real candidates.

    Inputs ``pf_cont [N, P, 4]`` (px, py, log pt, eta; GeV) and ``pf_class [N, P]`` float32
    class indices (:data:`~coffea_sonic.zoo.spec.DEEPMET_CLASSES`, 0 = padding). Each candidate's class
    embedding and scaled features, plus an event summary (the mean over candidates), go through a
    shared MLP to a weight in [0, 2]. Outputs ``met [N, 2]`` (px, py) and ``weights [N, P]``.
    """

    def __init__(self, embedding: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(DEEPMET_CLASSES), embedding)
        n_in = embedding + len(DEEPMET_FEATURES)
        self.local = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU())
        self.net = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        # px, py and eta to O(1) (fixed, not trained).
        self.register_buffer("feature_scale", torch.tensor([0.05, 0.05, 1.0, 0.4]),
                             persistent=False)

    def forward(self, pf_cont: "torch.Tensor", pf_class: "torch.Tensor"
                ) -> tuple["torch.Tensor", "torch.Tensor"]:
        # Computed in the dtype of the weights: the shipped ONNX runs in float64, so that a
        # candidate's weight does not depend on the batch it came in (GEMM blocking) and the
        # float32 MET is the same served and in-process.
        dtype = self.embed.weight.dtype
        pf_cont = pf_cont.to(dtype)
        classes = pf_class.round().long().clamp(0, len(DEEPMET_CLASSES) - 1)
        mask = (classes > 0).to(dtype).unsqueeze(2)  # [N, P, 1]
        scaled = pf_cont * self.feature_scale.to(dtype)
        hidden = self.local(torch.cat([self.embed(classes), scaled], dim=2)) * mask
        summary = hidden.sum(dim=1, keepdim=True) / torch.clamp(mask.sum(dim=1, keepdim=True), min=1.0)
        weights = 2.0 * torch.sigmoid(self.net(torch.cat([hidden, summary.expand_as(hidden)], dim=2)))
        weights = weights * mask  # [N, P, 1]
        met = -(weights * pf_cont[:, :, 0:2]).sum(dim=1)
        return met.to(torch.float32), weights.squeeze(2).to(torch.float32)


class EmTrkMichelId(nn.Module):
    """ProtoDUNE EmTrkMichelId CNN: [1,48,48] patch -> em/track/none softmax and Michel sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 48, kernel_size=5)
        flat = 48 * (EMTRK_PATCH - 4) * (EMTRK_PATCH - 4)
        self.dense = nn.Sequential(nn.Linear(flat, 128), nn.ReLU(), nn.Linear(128, 32), nn.ReLU())
        self.em_trk_none = nn.Linear(32, 3)
        self.michel = nn.Linear(32, 1)

    def forward(self, patch: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        hidden = self.dense(torch.flatten(torch.relu(self.conv(patch)), start_dim=1))
        return torch.softmax(self.em_trk_none(hidden), dim=1), torch.sigmoid(self.michel(hidden))


_BUILDERS = {"jet_tagger": JetTagger, "particlenet_lite": ParticleNetLite,
             "particlenet": ParticleNet, "deepmet": DeepMET, "emtrk_cnn": EmTrkMichelId}


def deterministic_init(module: "nn.Module", seed: int = WEIGHT_SEED) -> "nn.Module":
    """Fill every parameter from numpy's generator (He-like scale), independent of torch's RNG."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, parameter in sorted(module.named_parameters()):
            fan_in = int(np.prod(parameter.shape[1:])) if parameter.dim() > 1 else 1
            scale = math.sqrt(2.0 / fan_in) if parameter.dim() > 1 else 0.01
            values = rng.standard_normal(tuple(parameter.shape), dtype=np.float32) * np.float32(scale)
            parameter.copy_(torch.from_numpy(values))
    return module


def build(name: str, state_dict: dict | None = None) -> "nn.Module":
    """The torch module of zoo model ``name`` in eval mode, with deterministic or given weights."""
    try:
        module = _BUILDERS[name]()
    except KeyError:
        raise ModelNotFoundError(f"no zoo model {name!r}; known: {sorted(_BUILDERS)}") from None
    if state_dict is None:
        deterministic_init(module)
    else:
        module.load_state_dict(state_dict)
    return module.eval()
