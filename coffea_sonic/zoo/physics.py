"""Inputs of the zoo's physics models from NanoAOD-like columns (numpy/awkward, no torch).

What they are and an example: docs/internals/zoo.md, "Declarations, columns and weights".
"""

from __future__ import annotations

import logging
from typing import Any

import awkward as ak
import numpy as np

from .spec import DEEPMET_CLASSES, DEEPMET_FEATURES, DEEPMET_MAX_CANDIDATES

logger = logging.getLogger(__name__)


def candidate_classes(pdg_id: np.ndarray, from_pv: np.ndarray) -> np.ndarray:
    """:data:`~coffea_sonic.zoo.spec.DEEPMET_CLASSES` index (>= 1) of each PF candidate.

    >>> candidate_classes(np.array([211, -211, 11, -13, 22, 130]), np.array([3, 0, 3, 3, 1, 1]))
    array([1, 2, 3, 4, 5, 6])
    """
    magnitude = np.abs(np.asarray(pdg_id))
    from_pv = np.asarray(from_pv)
    names = np.select(
        [magnitude == 11, magnitude == 13, magnitude == 22, magnitude == 130, from_pv == 0],
        ["electron", "muon", "photon", "neutral_hadron", "charged_hadron_pileup"],
        "charged_hadron_pv")
    lookup = {name: index for index, name in enumerate(DEEPMET_CLASSES)}
    return np.vectorize(lookup.__getitem__, otypes=[np.int64])(names) if len(names) else \
        np.zeros(0, dtype=np.int64)


def deepmet_inputs(candidates: Any, max_candidates: int = DEEPMET_MAX_CANDIDATES
                   ) -> dict[str, np.ndarray]:
    """``deepmet`` inputs from per-event PF candidates ``[events][candidates]``.

    Needs fields ``pt, eta, phi, pdgId, fromPV``. Candidates are sorted by descending pt (so are
    the model's ``weights``) and each event keeps its ``max_candidates`` highest-pt ones; padding
    has class 0. Returns ``pf_cont [N, P, 4]`` float32 in
    :data:`~coffea_sonic.zoo.spec.DEEPMET_FEATURES` order and ``pf_class [N, P]`` float32
    class indices.
    """
    candidates = ak.Array(candidates)
    counts = ak.to_numpy(ak.num(candidates, axis=1)).astype(np.int64)
    flat = {name: ak.to_numpy(ak.flatten(candidates[name])).astype(np.float64)
            for name in ("pt", "eta", "phi", "pdgId", "fromPV")}
    n_events = len(counts)
    event_of = np.repeat(np.arange(n_events), counts)
    order = np.lexsort((-flat["pt"], event_of))
    flat = {name: values[order] for name, values in flat.items()}
    position = np.arange(len(event_of)) - np.repeat(np.cumsum(counts) - counts, counts)
    kept = position < max_candidates
    if not np.all(kept):
        logger.debug("deepmet keeps the %d highest-pt candidates of each event; %d dropped",
                     max_candidates, int((~kept).sum()))
    pf_cont = np.zeros((n_events, max_candidates, len(DEEPMET_FEATURES)), dtype=np.float32)
    pf_class = np.zeros((n_events, max_candidates), dtype=np.float32)
    rows, columns = event_of[kept], position[kept]
    pt = flat["pt"][kept]
    pf_cont[rows, columns] = np.stack(
        [pt * np.cos(flat["phi"][kept]), pt * np.sin(flat["phi"][kept]),
         np.log(np.maximum(pt, 1e-3)), flat["eta"][kept]], axis=1)
    pf_class[rows, columns] = candidate_classes(flat["pdgId"][kept], flat["fromPV"][kept])
    return {"pf_cont": pf_cont, "pf_class": pf_class}


def met_vector(pt: Any, phi: Any) -> np.ndarray:
    """``[N, 2]`` (px, py) float64 from per-event ``pt`` and ``phi``."""
    pt = np.asarray(pt, dtype=np.float64)
    phi = np.asarray(phi, dtype=np.float64)
    return np.stack([pt * np.cos(phi), pt * np.sin(phi)], axis=1)
