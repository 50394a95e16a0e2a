"""Train the zoo's jet-parton assignment BDT pair (``reconstruction_bdt_xgb``) on the synthetic
AGC-like sample (:mod:`coffea_sonic.data.agc_sample`), in the AGC's shape: XGBoost
``binary:logistic`` on the 20 features of every jet permutation
(:mod:`coffea_sonic.examples.agc_features`), label 1 for the permutation whose jets are the true
(W, W, b_tophad, b_toplep), 0 for the others; one model trained on even-numbered events
(``agc_bdt_even.json``, served as version 2) and one on odd ones (``agc_bdt_odd.json``,
version 1). Small (60 trees of depth 4) and deterministic.

Regenerate the committed files with ``python -m zoo_training.train_agc_bdt`` (from ``scripts/``).

>>> rows, labels, counts, events = truth_labelled_permutations(40, seed=5)
>>> rows.shape[1], int(labels.sum()) == len(counts), int(counts.sum()) == len(rows)
(20, True, True)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import awkward as ak
import numpy as np

from coffea_sonic import zoo
from coffea_sonic.data.agc_sample import B_TOPHAD, B_TOPLEP, W_JET, generate_events
from coffea_sonic.examples.agc_features import MAX_N_JETS, features_from_arrays, permutation_table

__all__ = ["truth_labelled_permutations", "train_pair", "main", "TRAINING_EVENTS", "PARAMETERS"]

logger = logging.getLogger(__name__)

TRAINING_EVENTS = 40_000
TRAINING_SEED = 20_240_101
ROUNDS = 60
PARAMETERS: dict[str, Any] = {"objective": "binary:logistic", "max_depth": 4, "eta": 0.2,
                              "subsample": 0.8, "seed": 7, "nthread": 1,
                              "eval_metric": "logloss"}
#: Where the committed boosters live: the package's zoo.
_ZOO = Path(zoo.__file__).parent
_JET_FIELDS = ("pt", "eta", "phi", "mass", "btagCSVV2", "qgl")


def truth_labelled_permutations(events: int, *, seed: int = TRAINING_SEED, first_event: int = 1
                                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Generate ``events`` events, select them as the AGC does (one lepton, >= 4 jets, >= 2 b
    tags) and keep those whose four truth jets are among the leading six: ``(rows [n, 20],
    labels [n] (1: the true permutation), permutations per event, event numbers)``."""
    generated = generate_events(events, seed=seed, first_event=first_event)
    jets, elecs, muons = generated["Jet"], generated["Electron"], generated["Muon"]
    jets = jets[(jets.pt > 30) & (np.abs(jets.eta) < 2.4) & ((jets.jetId & 4) == 4)]
    elecs = elecs[(elecs.pt > 30) & (np.abs(elecs.eta) < 2.1) & (elecs.cutBased == 4)
                  & (elecs.sip3d < 4)]
    muons = muons[(muons.pt > 30) & (np.abs(muons.eta) < 2.1) & muons.tightId
                  & (muons.sip3d < 4) & (muons.pfRelIso04_all < 0.15)]
    truth = ak.to_numpy(ak.fill_none(ak.pad_none(jets.truthLabel, MAX_N_JETS, clip=True), 0))
    found = ((truth == W_JET).sum(1) == 2) & ((truth == B_TOPHAD).sum(1) == 1) & (
        (truth == B_TOPLEP).sum(1) == 1)
    keep = ak.to_numpy((ak.num(elecs) + ak.num(muons) == 1) & (ak.num(jets) >= 4)
                       & (ak.sum(jets.btagCSVV2 > 0.5, axis=1) >= 2)) & found
    jets, elecs, muons, truth = jets[keep], elecs[keep], muons[keep], truth[keep]
    leading = {f: ak.to_numpy(ak.fill_none(ak.pad_none(jets[f], MAX_N_JETS, clip=True), 0.0))
               for f in _JET_FIELDS}
    lepton = {f: ak.to_numpy(ak.flatten(ak.concatenate([elecs[f], muons[f]], axis=1)))
              for f in ("pt", "eta", "phi", "mass")}
    n_jets = ak.to_numpy(ak.num(jets))
    rows, counts = features_from_arrays(leading, lepton, n_jets)
    _, event, index = permutation_table(n_jets)
    assigned = truth[event[:, None], index]
    labels = np.all(assigned == np.array([W_JET, W_JET, B_TOPHAD, B_TOPLEP]), axis=1)
    return rows, labels.astype(np.int32), counts, generated["event"][keep]


def train_pair(events: int = TRAINING_EVENTS, *, seed: int = TRAINING_SEED,
               rounds: int = ROUNDS) -> dict[str, Any]:
    """The two boosters: ``{"even": trained on even events, "odd": trained on odd events}``."""
    import xgboost

    rows, labels, counts, numbers = truth_labelled_permutations(events, seed=seed)
    even_rows = np.repeat(numbers % 2 == 0, counts)
    boosters = {}
    for name, mask in (("even", even_rows), ("odd", ~even_rows)):
        matrix = xgboost.DMatrix(rows[mask], labels[mask])
        boosters[name] = xgboost.train(PARAMETERS, matrix, rounds)
        logger.info("trained the %s model on %d permutations", name, int(mask.sum()))
    return boosters


def main(folder: str | Path | None = None) -> None:
    """Write ``agc_bdt_even.json`` and ``agc_bdt_odd.json`` into ``folder`` (default: the zoo)."""
    target = Path(folder) if folder is not None else _ZOO
    for name, booster in train_pair().items():
        booster.save_model(str(target / f"agc_bdt_{name}.json"))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
