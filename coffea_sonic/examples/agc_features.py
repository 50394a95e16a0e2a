"""The Analysis Grand Challenge's jet-parton assignment features, in numpy, without padding.

How they follow the AGC, with an example: docs/internals/examples.md.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

__all__ = ["FEATURE_NAMES", "BIN_LOW", "BIN_HIGH", "MAX_N_JETS", "permutations",
           "permutation_table", "features_from_arrays"]

#: Jets considered per event (the AGC's ``MAX_N_JETS``).
MAX_N_JETS = 6
#: The AGC's feature names (``config["ml"]["FEATURE_NAMES"]``), in input order.
FEATURE_NAMES: tuple[str, ...] = (
    "deltar_leptonbtoplep", "deltar_w1w2", "deltar_w1btophad", "deltar_w2btophad",
    "mass_leptonbtoplep", "mass_w1w2", "mass_w1w2btophad", "pt_w1w2btophad",
    "pt_w1", "pt_w2", "pt_btophad", "pt_btoplep",
    "btag_w1", "btag_w2", "btag_btophad", "btag_btoplep",
    "qgl_w1", "qgl_w2", "qgl_btophad", "qgl_btoplep")
#: The AGC's histogram ranges of each feature (25 bins each).
BIN_LOW: tuple[float, ...] = (0, 0, 0, 0, 50, 50, 50, 50, 25, 25, 25, 25, 0, 0, 0, 0,
                              -1, -1, -1, -1)
BIN_HIGH: tuple[float, ...] = (6, 6, 6, 6, 300, 300, 550, 550, 300, 300, 300, 300, 1, 1, 1, 1,
                               1, 1, 1, 1)


@functools.lru_cache(maxsize=None)
def permutations(n_jets: int) -> np.ndarray:
    """The AGC's permutations of ``n_jets`` (4 to 6) jets: ``[count, 4]`` jet indices
    (W1, W2, b_tophad, b_toplep). Of the two orders of each W pair the AGC keeps the later one
    in lexicographic order (W1 > W2).

    >>> permutations(5).shape
    (60, 4)
    """
    kept = [p for p in itertools.permutations(range(n_jets), 4) if p[0] > p[1]]
    table = np.asarray(kept, dtype=np.int64)
    table.setflags(write=False)
    return table


def permutation_table(n_jets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For events of ``n_jets`` jets (>= 4): ``(counts, event_of_row, jet_index)``, the rows per
    event, the event of every row, and the ``[rows, 4]`` jet indices of every row.

    >>> counts, event, index = permutation_table(np.array([4, 7]))
    >>> counts.tolist(), int(event[-1]), index.shape
    ([12, 180], 1, (192, 4))
    """
    used = np.minimum(np.asarray(n_jets, dtype=np.int64), MAX_N_JETS)
    if used.size and used.min() < 4:
        raise ValueError("the AGC's permutations need at least 4 jets per event")
    sizes = np.array([0, 0, 0, 0] + [len(permutations(n)) for n in range(4, MAX_N_JETS + 1)])
    counts = sizes[used] if used.size else np.zeros(0, dtype=np.int64)
    event = np.repeat(np.arange(len(used)), counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    local = np.arange(int(counts.sum())) - np.repeat(starts, counts)
    padded = np.zeros((MAX_N_JETS + 1, sizes.max(initial=0), 4), dtype=np.int64)
    for n in range(4, MAX_N_JETS + 1):
        padded[n, :sizes[n]] = permutations(n)
    index = padded[used[event], local] if len(event) else np.zeros((0, 4), dtype=np.int64)
    return counts, event, index


def _p4(pt: np.ndarray, eta: np.ndarray, phi: np.ndarray, mass: np.ndarray) -> np.ndarray:
    pt, eta, phi, mass = (np.asarray(a, dtype=np.float64) for a in (pt, eta, phi, mass))
    px, py, pz = pt * np.cos(phi), pt * np.sin(phi), pt * np.sinh(eta)
    energy = np.sqrt(px ** 2 + py ** 2 + pz ** 2 + mass ** 2)
    return np.stack([px, py, pz, energy], axis=-1)


def _mass(p4: np.ndarray) -> np.ndarray:
    square = p4[..., 3] ** 2 - (p4[..., :3] ** 2).sum(axis=-1)
    return np.sqrt(np.maximum(square, 0.0))


def features_from_arrays(jets: dict[str, np.ndarray], lepton: dict[str, np.ndarray],
                         n_jets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The AGC's 20 features of every permutation of every event: ``(rows [n, 20] float32,
    counts per event)``.

    ``jets``: ``pt, eta, phi, mass, btagCSVV2, qgl`` as ``[events, >= 6]`` arrays (pt-ordered,
    anything beyond an event's jets unused); ``lepton``: ``pt, eta, phi, mass`` per event (its one
    lepton); ``n_jets``: jets per event (>= 4).
    """
    counts, event, index = permutation_table(n_jets)
    rows = np.zeros((len(event), 20), dtype=np.float64)
    if not len(event):
        return rows.astype(np.float32), counts

    def jet(field: str, slot: int) -> np.ndarray:
        return np.asarray(jets[field], dtype=np.float64)[event, index[:, slot]]

    eta = [jet("eta", s) for s in range(4)]
    phi = [jet("phi", s) for s in range(4)]
    pt = [jet("pt", s) for s in range(4)]
    p4 = [_p4(pt[s], eta[s], phi[s], jet("mass", s)) for s in range(4)]
    lep_eta = np.asarray(lepton["eta"], dtype=np.float64)[event]
    lep_phi = np.asarray(lepton["phi"], dtype=np.float64)[event]
    lep_p4 = _p4(*(np.asarray(lepton[f], dtype=np.float64)[event]
                   for f in ("pt", "eta", "phi", "mass")))

    def delta_r(eta1, phi1, eta2, phi2):
        return np.sqrt((eta1 - eta2) ** 2 + (phi1 - phi2) ** 2)

    rows[:, 0] = delta_r(lep_eta, lep_phi, eta[3], phi[3])
    rows[:, 1] = delta_r(eta[0], phi[0], eta[1], phi[1])
    rows[:, 2] = delta_r(eta[0], phi[0], eta[2], phi[2])
    rows[:, 3] = delta_r(eta[1], phi[1], eta[2], phi[2])
    rows[:, 4] = _mass(lep_p4 + p4[3])
    rows[:, 5] = _mass(p4[0] + p4[1])
    top = p4[0] + p4[1] + p4[2]
    rows[:, 6] = _mass(top)
    rows[:, 7] = np.hypot(top[:, 0], top[:, 1])
    for slot in range(4):
        rows[:, 8 + slot] = pt[slot]
        rows[:, 12 + slot] = jet("btagCSVV2", slot)
        rows[:, 16 + slot] = jet("qgl", slot)
    return rows.astype(np.float32), counts
