"""Train the zoo's physics models on the synthetic PFNano-like sample (CPU, seconds, fixed seeds).

* ``particlenet``: the EdgeConv tagger on each jet's PF constituents, labelled by
  ``Jet_hadronFlavour`` (b, c, light), from ``ttbar`` events of
  :func:`coffea_sonic.data.synthetic.generate_events`;
* ``deepmet``: per-candidate weights over each event's PF candidates regressed to the true MET
  (``GenMET``) of ``ttbar`` and ``qcd_light`` events; its inputs are the package's
  (:func:`coffea_sonic.zoo.physics.deepmet_inputs`).

``python -m zoo_training.export particlenet deepmet`` (from ``scripts/``) trains both and writes
the shipped ONNX files.

>>> met_resolution(np.array([[1.0, 0.0], [3.0, 4.0]]), np.array([[0.0, 0.0], [3.0, 4.0]]))
0.5
"""

from __future__ import annotations

import logging
import time
from typing import Any

import awkward as ak
import numpy as np

from coffea_sonic.errors import InputValidationError, require
from coffea_sonic.zoo.physics import deepmet_inputs, met_vector

from .train import FLAVOUR_TO_CLASS, b_vs_light_auc, fit

logger = logging.getLogger(__name__)

#: Seed offset of validation samples, so they never repeat training events.
VALIDATION_SEED_OFFSET = 1_000_003
#: Default training sizes (events) and epochs of the shipped models.
PARTICLENET_TRAIN_EVENTS = 3500
PARTICLENET_EPOCHS = 6
DEEPMET_TRAIN_EVENTS = 8000
DEEPMET_EPOCHS = 10


def _torch():
    torch = require("torch", "training the zoo models")
    from coffea_sonic.zoo import torch_models

    return torch, torch_models


def _training_start(threads: int, seed: int) -> tuple[Any, Any, float]:
    """torch and the zoo's torch models, seeded, on ``threads`` threads (0: torch's default);
    the start time of the training."""
    torch, torch_models = _torch()
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    return torch, torch_models, time.perf_counter()


def _events(process: str, n_events: int, seed: int) -> ak.Array:
    """Synthetic events of ``process`` as one awkward record array (no ROOT file written)."""
    from coffea_sonic.data.synthetic import generate_events

    content = generate_events(process, n_events, seed=seed)
    return ak.zip({name: content[name] for name in content}, depth_limit=1)


# -- particlenet -------------------------------------------------------------------------------
def particlenet_dataset(n_events: int, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every jet of ``n_events`` synthetic ttbar events: particlenet inputs and hadron flavours.

    >>> inputs, flavour = particlenet_dataset(20, seed=1)
    >>> inputs["pf_points"].shape[1:], len(flavour) == len(inputs["pf_mask"])
    ((2, 32), True)
    """
    from coffea_sonic.columns import jet_constituents
    from coffea_sonic.zoo.inputs import pad_constituents

    events = _events("ttbar", n_events, seed)
    inputs = pad_constituents(jet_constituents(events), events.Jet)
    return inputs, ak.to_numpy(ak.flatten(events.Jet.hadronFlavour)).astype(np.int32)


def train_particlenet(n_events: int = PARTICLENET_TRAIN_EVENTS, seed: int = 0,
                      epochs: int = PARTICLENET_EPOCHS, batch_size: int = 128,
                      learning_rate: float = 5e-3, n_validation: int = 1000,
                      threads: int | None = 2):
    """Train zoo ``particlenet`` on the jets of ``n_events`` ttbar events; return (model, AUC).

    Deterministic weights, then Adam on cross-entropy with cosine decay and seeded shuffling, so
    a seed gives the same weights on a given machine (``threads`` fixes torch's thread count).
    The AUC is b vs light on the jets of ``n_validation`` fresh ttbar events.

    >>> model, auc = train_particlenet(n_events=100, epochs=1, n_validation=100)
    >>> auc == particlenet_auc(model, 100, VALIDATION_SEED_OFFSET)  # fresh events, seed 0
    True
    """
    torch, torch_models, started = _training_start(threads, seed)
    inputs, flavour = particlenet_dataset(n_events, seed)
    labels = torch.from_numpy(np.vectorize(FLAVOUR_TO_CLASS.__getitem__, otypes=[np.int64])(flavour))
    tensors = [torch.from_numpy(inputs[name]) for name in ("pf_points", "pf_features", "pf_mask")]
    n_jets = len(labels)
    if n_jets < batch_size or epochs < 1:
        raise InputValidationError(f"need >= {batch_size} jets and epochs >= 1, got {n_jets} "
                                   f"jets from {n_events} events and epochs={epochs}")
    model = torch_models.build("particlenet").train()
    loss_function = torch.nn.CrossEntropyLoss()
    fit(model, lambda batch: loss_function(model.logits(*(t[batch] for t in tensors)),
                                           labels[batch]),
        n_jets, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, seed=seed,
        name="particlenet")
    auc = particlenet_auc(model, n_validation, seed + VALIDATION_SEED_OFFSET)
    logger.info("trained particlenet on %d jets (%d ttbar events), %d epochs in %.1f s: "
                "b-vs-light ROC AUC %.4f on the jets of %d fresh events", n_jets, n_events, epochs,
                time.perf_counter() - started, auc, n_validation)
    return model, auc


def particlenet_auc(model: Any, n_events: int, seed: int) -> float:
    """b-vs-light ROC AUC of a particlenet torch ``model`` on the jets of fresh ttbar events."""
    torch, _ = _torch()
    inputs, flavour = particlenet_dataset(n_events, seed)
    with torch.no_grad():
        probs = model(*(torch.from_numpy(inputs[name])
                        for name in ("pf_points", "pf_features", "pf_mask"))).numpy()
    return b_vs_light_auc(probs, flavour)


# -- deepmet ----------------------------------------------------------------------------------
def met_resolution(predicted: np.ndarray, true: np.ndarray) -> float:
    """RMS per component of the (px, py) residuals ``predicted - true`` (GeV)."""
    residual = np.asarray(predicted, dtype=np.float64) - np.asarray(true, dtype=np.float64)
    return float(np.sqrt(np.mean(residual ** 2)))


def deepmet_dataset(n_events: int, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """``n_events`` ttbar and ``n_events`` qcd_light events: inputs, GenMET and PF MET ``[N, 2]``.

    >>> inputs, gen_met, pf_met = deepmet_dataset(10, seed=1)
    >>> inputs["pf_class"].shape, gen_met.shape
    ((20, 160), (20, 2))
    """
    parts = [_events(process, n_events, seed) for process in ("ttbar", "qcd_light")]
    events = ak.concatenate(parts)
    return (deepmet_inputs(events.PFCands), met_vector(events.GenMET_pt, events.GenMET_phi),
            met_vector(events.MET_pt, events.MET_phi))


def train_deepmet(n_events: int = DEEPMET_TRAIN_EVENTS, seed: int = 0,
                  epochs: int = DEEPMET_EPOCHS, batch_size: int = 128,
                  learning_rate: float = 3e-3, n_validation: int = 3000,
                  threads: int | None = 2):
    """Train zoo ``deepmet`` on ``n_events`` ttbar plus ``n_events`` qcd_light events.

    Returns ``(model, deepmet_resolution, pf_resolution)``: the RMS (GeV) of the MET (px, py)
    residuals against GenMET on fresh validation events, for the model and for PF MET. Huber
    loss on (px, py), Adam with cosine decay, seeded shuffling.

    >>> model, ours, pf = train_deepmet(n_events=200, epochs=1, n_validation=100)
    >>> ours > 0 and pf > 0
    True
    """
    torch, torch_models, started = _training_start(threads, seed)
    inputs, gen_met, _ = deepmet_dataset(n_events, seed)
    pf_cont, pf_class = torch.from_numpy(inputs["pf_cont"]), torch.from_numpy(inputs["pf_class"])
    target = torch.from_numpy(gen_met.astype(np.float32))
    n_rows = len(target)
    if n_rows < batch_size or epochs < 1:
        raise InputValidationError(f"need >= {batch_size} events and epochs >= 1, got {n_rows} "
                                   f"and epochs={epochs}")
    model = torch_models.build("deepmet").train()
    loss_function = torch.nn.HuberLoss(delta=5.0)

    def loss_of(batch: Any) -> Any:
        met, _ = model(pf_cont[batch], pf_class[batch])
        return loss_function(met, target[batch])

    fit(model, loss_of, n_rows, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, seed=seed, name="deepmet")
    ours, pf = deepmet_resolution(model, n_validation, seed + VALIDATION_SEED_OFFSET)
    logger.info("trained deepmet on %d events, %d epochs in %.1f s: MET (px, py) resolution "
                "%.2f GeV vs PF MET %.2f GeV on %d fresh events", n_rows, epochs,
                time.perf_counter() - started, ours, pf, 2 * n_validation)
    return model, ours, pf


def deepmet_resolution(model: Any, n_events: int, seed: int) -> tuple[float, float]:
    """(deepmet, PF MET) resolution in GeV on ``n_events`` fresh events of each process."""
    torch, _ = _torch()
    inputs, gen_met, pf_met = deepmet_dataset(n_events, seed)
    with torch.no_grad():
        met, _ = model(torch.from_numpy(inputs["pf_cont"]), torch.from_numpy(inputs["pf_class"]))
    return met_resolution(met.numpy(), gen_met), met_resolution(pf_met, gen_met)
