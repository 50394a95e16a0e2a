"""A synthetic AGC-like sample: semileptonic ttbar NanoAOD files that the Analysis Grand
Challenge's selection and ML step read (CMS open data cannot be reached from here).

How it is simulated: docs/internals/examples.md, "The AGC-like sample" (with an example).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import awkward as ak
import numpy as np

__all__ = ["generate_events", "write_agc_sample", "TOP_MASS", "W_MASS"]

logger = logging.getLogger(__name__)

TOP_MASS, W_MASS, B_MASS = 172.5, 80.4, 4.8
#: Truth labels of ``Jet_truthLabel`` (the AGC's, with 0 for jets of no top).
W_JET, B_TOPHAD, B_TOPLEP, OTHER = 24, 6, -6, 0


def _two_body(parent: np.ndarray, m1: float, m2: float,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Isotropic two-body decay of ``parent`` (``[n, 4]`` px, py, pz, E) into masses m1, m2."""
    n = len(parent)
    mass = np.sqrt(np.maximum(parent[:, 3] ** 2 - (parent[:, :3] ** 2).sum(1), 1e-9))
    p_star = np.sqrt(np.maximum((mass ** 2 - (m1 + m2) ** 2) * (mass ** 2 - (m1 - m2) ** 2),
                                0.0)) / (2 * mass)
    cos_t = rng.uniform(-1, 1, n)
    sin_t = np.sqrt(1 - cos_t ** 2)
    phi = rng.uniform(-np.pi, np.pi, n)
    direction = np.stack([sin_t * np.cos(phi), sin_t * np.sin(phi), cos_t], axis=1)
    first = np.concatenate([direction * p_star[:, None],
                            np.sqrt(p_star ** 2 + m1 ** 2)[:, None]], axis=1)
    second = np.concatenate([-direction * p_star[:, None],
                             np.sqrt(p_star ** 2 + m2 ** 2)[:, None]], axis=1)
    beta = parent[:, :3] / parent[:, 3:4]
    return _boost(first, beta), _boost(second, beta)


def _boost(p4: np.ndarray, beta: np.ndarray) -> np.ndarray:
    b2 = np.maximum((beta ** 2).sum(1), 1e-12)
    gamma = 1 / np.sqrt(1 - np.minimum(b2, 1 - 1e-12))
    bp = (beta * p4[:, :3]).sum(1)
    factor = (gamma - 1) * bp / b2 + gamma * p4[:, 3]
    momentum = p4[:, :3] + factor[:, None] * beta
    energy = gamma * (p4[:, 3] + bp)
    return np.concatenate([momentum, energy[:, None]], axis=1)


def _pt_eta_phi(p4: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pt = np.hypot(p4[:, 0], p4[:, 1])
    return pt, np.arcsinh(p4[:, 2] / np.maximum(pt, 1e-9)), np.arctan2(p4[:, 1], p4[:, 0])


def _top(n: int, rng: np.random.Generator) -> np.ndarray:
    pt = rng.exponential(90.0, n) + 10.0
    eta = rng.normal(0.0, 1.1, n)
    phi = rng.uniform(-np.pi, np.pi, n)
    px, py, pz = pt * np.cos(phi), pt * np.sin(phi), pt * np.sinh(eta)
    return np.stack([px, py, pz, np.sqrt(px ** 2 + py ** 2 + pz ** 2 + TOP_MASS ** 2)], axis=1)


def generate_events(events: int, *, seed: int = 0, first_event: int = 1) -> dict[str, ak.Array]:
    """``events`` semileptonic ttbar events (deterministic in ``seed``): ``event`` numbers from
    ``first_event`` and the ``Jet``, ``Electron`` and ``Muon`` collections (jets pt-ordered,
    with ``truthLabel``), as awkward arrays of NanoAOD field names."""
    rng = np.random.default_rng(seed)
    n = events
    b_had, w_had = _two_body(_top(n, rng), B_MASS, W_MASS, rng)
    q1, q2 = _two_body(w_had, 0.3, 0.3, rng)
    b_lep, w_lep = _two_body(_top(n, rng), B_MASS, W_MASS, rng)
    lepton, _neutrino = _two_body(w_lep, 0.0, 0.0, rng)

    partons = [(q1, W_JET), (q2, W_JET), (b_had, B_TOPHAD), (b_lep, B_TOPLEP)]
    jets = _jets(rng, partons, n)
    electrons, muons = _leptons(rng, lepton, n)
    return {"event": np.arange(first_event, first_event + n, dtype=np.uint64),
            "run": np.ones(n, dtype=np.uint32),
            "luminosityBlock": (np.arange(n) // 1000 + 1).astype(np.uint32),
            "Jet": jets, "Electron": electrons, "Muon": muons}


def _jets(rng: np.random.Generator, partons: list[tuple[np.ndarray, int]], n: int) -> ak.Array:
    """The four quark jets and a Poisson number of extra jets per event, pt-ordered."""
    extra = rng.poisson(1.3, n)
    n_jets = 4 + extra
    total = int(n_jets.sum())
    starts = np.concatenate([[0], np.cumsum(n_jets)[:-1]])
    pt, eta, phi = np.zeros(total), np.zeros(total), np.zeros(total)
    label = np.zeros(total, dtype=np.int32)
    for slot, (p4, truth) in enumerate(partons):
        where = starts + slot
        pt[where], eta[where], phi[where] = _pt_eta_phi(p4)
        label[where] = truth
    is_extra = np.ones(total, dtype=bool)
    for slot in range(4):
        is_extra[starts + slot] = False
    count_extra = int(is_extra.sum())
    pt[is_extra] = 20.0 + rng.exponential(30.0, count_extra)
    eta[is_extra] = rng.normal(0.0, 1.6, count_extra)
    phi[is_extra] = rng.uniform(-np.pi, np.pi, count_extra)
    pt = pt * rng.normal(1.0, 0.10, total).clip(0.5)
    mass = pt * rng.uniform(0.05, 0.15, total)
    is_b = np.abs(label) == 6
    btag = np.where(is_b, np.where(rng.random(total) < 0.8, rng.beta(6.0, 1.3, total),
                                   rng.beta(1.2, 4.0, total)),
                    np.where(rng.random(total) < 0.05, rng.beta(3.0, 2.0, total),
                             rng.beta(1.0, 8.0, total)))
    qgl = np.where(label == W_JET, rng.beta(3.0, 1.8, total),
                   np.where(is_b, rng.beta(2.5, 2.5, total), rng.beta(1.6, 3.0, total)))
    jet_id = np.where(rng.random(total) < 0.97, 6, 2).astype(np.int32)

    # pt order inside each event, the truth label travelling with its jet
    event_of_jet = np.repeat(np.arange(n), n_jets)
    order = np.lexsort((-pt, event_of_jet))
    jets = ak.unflatten(ak.zip({
        "pt": pt[order].astype(np.float32), "eta": eta[order].astype(np.float32),
        "phi": phi[order].astype(np.float32), "mass": mass[order].astype(np.float32),
        "btagCSVV2": btag[order].astype(np.float32), "qgl": qgl[order].astype(np.float32),
        "jetId": jet_id[order], "truthLabel": label[order]}), n_jets)
    return jets


def _leptons(rng: np.random.Generator, lepton: np.ndarray, n: int) -> tuple[ak.Array, ak.Array]:
    """The one lepton of each event, as an electron or a muon."""
    lep_pt, lep_eta, lep_phi = _pt_eta_phi(lepton)
    is_electron = rng.random(n) < 0.5
    sip3d = rng.exponential(1.2, n)
    charge = np.where(rng.random(n) < 0.5, -1, 1).astype(np.int32)

    def leptons(mask: np.ndarray, mass: float, fields: dict[str, np.ndarray]) -> ak.Array:
        record = {"pt": lep_pt[mask].astype(np.float32), "eta": lep_eta[mask].astype(np.float32),
                  "phi": lep_phi[mask].astype(np.float32),
                  "mass": np.full(int(mask.sum()), mass, np.float32),
                  "sip3d": sip3d[mask].astype(np.float32), "charge": charge[mask],
                  **{k: v[mask] for k, v in fields.items()}}
        return ak.unflatten(ak.zip(record), mask.astype(np.int64))

    electrons = leptons(is_electron, 0.000511, {
        "cutBased": np.where(rng.random(n) < 0.9, 4, 2).astype(np.int32)})
    muons = leptons(~is_electron, 0.10566, {
        "tightId": rng.random(n) < 0.92,
        "pfRelIso04_all": rng.exponential(0.05, n).astype(np.float32)})
    return electrons, muons


def write_agc_sample(directory: str | os.PathLike, *, events: int = 4000, files: int = 2,
                     seed: int = 0) -> dict[str, list[str]]:
    """Write ``files`` ROOT files of ``events`` events each (tree ``Events``) under
    ``directory``; return the fileset ``{"ttbar": [paths]}``. Event numbers run on across
    files, so even and odd events are both in every file."""
    import uproot

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(files):
        arrays = generate_events(events, seed=seed * 1000 + index,
                                 first_event=1 + index * events)
        path = folder / f"agc_ttbar_{seed}_{index}.root"
        with uproot.recreate(path) as file:
            types = {name: (values.dtype if isinstance(values, np.ndarray)
                            else values.type.content) for name, values in arrays.items()}
            file.mktree("Events", types).extend(arrays)
        paths.append(str(path))
        logger.info("wrote %s (%d events)", path, events)
    return {"ttbar": paths}
