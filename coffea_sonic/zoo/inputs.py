"""Column recipes of the zoo's models: analysis columns -> the tensors a zoo model takes.

The generic conversions are in :mod:`coffea_sonic.columns` (docs/internals/zoo.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import awkward as ak
import numpy as np

from ..columns import (CONSTITUENT_FIELDS, as_awkward, field_rows, is_typetracer, n_objects,
                       to_numpy, touch, var_depth)
from ..errors import InputValidationError
from .spec import PARTICLENET_FEATURES, PARTICLENET_MAX_CONSTITUENTS

__all__ = ["JET_AXIS_FIELDS", "pad_constituents"]

#: Jet fields :func:`pad_constituents` takes the jet axis and energy from.
JET_AXIS_FIELDS: tuple[str, ...] = ("pt", "eta", "phi", "mass")
#: Floor under arguments of logarithms, so empty or zero-momentum entries stay finite.
_LOG_FLOOR = 1e-12


def _wrap_phi(phi: np.ndarray) -> np.ndarray:
    return (phi + math.pi) % (2 * math.pi) - math.pi


def _energy(pt: np.ndarray, eta: np.ndarray, mass: np.ndarray) -> np.ndarray:
    momentum = pt * np.cosh(eta)
    return np.sqrt(momentum * momentum + mass * mass)


def _safe_log(values: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(values, _LOG_FLOOR))


def _empty_particlenet_inputs(n_jets: int, size: int) -> dict[str, np.ndarray]:
    return {
        "pf_points": np.zeros((n_jets, 2, size), dtype=np.float32),
        "pf_features": np.zeros((n_jets, len(PARTICLENET_FEATURES), size), dtype=np.float32),
        "pf_mask": np.zeros((n_jets, 1, size), dtype=np.float32),
    }


def pad_constituents(constituents: Any, jets: Any = None, *,
                     max_constituents: int = PARTICLENET_MAX_CONSTITUENTS,
                     defaults: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """``particlenet_lite`` inputs per jet from its constituents: points, features, mask.

    ``constituents`` is jagged ``[..., jets][constituents]`` with fields ``pt, eta, phi, mass,
    charge`` (e.g. from :func:`coffea_sonic.columns.jet_constituents`); ``jets``, if given, is ``[..., jets]`` with
    ``pt, eta, phi, mass`` and supplies the jet axis and energy, else the constituents' four-vector
    sum does. Returns float32 ``pf_points [N, 2, P]`` (deta, dphi), ``pf_features [N, 7, P]`` in
    :data:`~coffea_sonic.zoo.spec.PARTICLENET_FEATURES` order (log_pt, log_e, log_pt_rel,
    log_e_rel, deta, dphi, charge) and ``pf_mask [N, 1, P]``, with ``N`` jets in flattened order
    and ``P = max_constituents``. Jets with more constituents keep their ``P`` highest-pt ones
    (constituents are sorted by descending pt); shorter jets are zero-padded with mask 0.
    ``deta = eta - jet_eta`` and ``dphi`` is wrapped into [-pi, pi).

    >>> jet = [[{"pt": 30.0, "eta": 0.1, "phi": 0.0, "mass": 0.1, "charge": 1},
    ...         {"pt": 10.0, "eta": -0.1, "phi": 0.2, "mass": 0.0, "charge": 0}]]
    >>> inputs = pad_constituents(ak.Array([jet]))  # one event with one two-constituent jet
    >>> inputs["pf_features"].shape, inputs["pf_mask"][0, 0, :3].tolist()
    ((1, 7, 32), [1.0, 1.0, 0.0])
    """
    if max_constituents < 1:
        raise InputValidationError(f"max_constituents must be >= 1, got {max_constituents}")
    constituents = as_awkward(constituents, "constituents")
    defaults = dict(defaults or {})
    depth = var_depth(constituents.layout)
    if depth < 1:
        raise InputValidationError(
            "constituents must be jagged per jet ([jets][constituents] or "
            f"[events][jets][constituents]), got type {constituents.type}")
    typetracer = is_typetracer(constituents) or (jets is not None and is_typetracer(jets))
    # Per-jet lists: flatten every jagged level above the constituent axis.
    per_jet = constituents
    for _ in range(depth - 1):
        per_jet = ak.flatten(per_jet, axis=1)
    candidate_counts = ak.num(per_jet, axis=1)
    n_rows = (n_objects(per_jet) if not typetracer
              and any(name not in ak.fields(per_jet) for name in CONSTITUENT_FIELDS) else None)
    columns = {name: field_rows(per_jet, name, "PFCands", defaults, n_rows,
                                np.dtype(np.float64)) for name in CONSTITUENT_FIELDS}
    jet_columns = None
    if jets is not None:
        jets = as_awkward(jets, "jets")
        jet_columns = {name: field_rows(jets, name, "Jet", {}, None,
                                        np.dtype(np.float64)) for name in JET_AXIS_FIELDS}
    if typetracer:
        touch(candidate_counts)
        return _empty_particlenet_inputs(0, max_constituents)

    counts = to_numpy(candidate_counts, "constituent counts").astype(np.int64)
    if jet_columns is not None and len(jet_columns["pt"]) != len(counts):
        raise InputValidationError(
            f"jets has {len(jet_columns['pt'])} jets but constituents are grouped into "
            f"{len(counts)} jets; pass the jets the constituents were taken from")
    return _fill(columns, counts, jet_columns, max_constituents)


def _jet_axes(columns: Mapping[str, np.ndarray], counts: np.ndarray,
              jet_columns: Mapping[str, np.ndarray] | None) -> tuple[np.ndarray, ...]:
    """Each jet's ``(pt, eta, phi, energy)``: the jets' own, or (no jets given) the four-vector
    sum of all its constituents, before truncation, like a clustered jet's."""
    if jet_columns is not None:
        jet_pt, jet_eta, jet_phi = jet_columns["pt"], jet_columns["eta"], jet_columns["phi"]
        return jet_pt, jet_eta, jet_phi, _energy(jet_pt, jet_eta, jet_columns["mass"])
    n_jets = len(counts)
    all_pt, all_eta, all_phi = columns["pt"], columns["eta"], columns["phi"]
    all_jets = np.repeat(np.arange(n_jets), counts)
    px = np.bincount(all_jets, weights=all_pt * np.cos(all_phi), minlength=n_jets)
    py = np.bincount(all_jets, weights=all_pt * np.sin(all_phi), minlength=n_jets)
    pz = np.bincount(all_jets, weights=all_pt * np.sinh(all_eta), minlength=n_jets)
    jet_energy = np.bincount(all_jets, weights=_energy(all_pt, all_eta, columns["mass"]),
                             minlength=n_jets)
    jet_pt = np.hypot(px, py)
    return jet_pt, np.arcsinh(pz / np.maximum(jet_pt, _LOG_FLOOR)), np.arctan2(py, px), jet_energy


def _fill(columns: Mapping[str, np.ndarray], counts: np.ndarray,
          jet_columns: Mapping[str, np.ndarray] | None,
          max_constituents: int) -> dict[str, np.ndarray]:
    """The padded tensors of jets with ``counts`` constituents (``columns``, flat)."""
    n_jets = len(counts)
    jet_of = np.repeat(np.arange(n_jets), counts)
    order = np.lexsort((-columns["pt"], jet_of))
    jet_of = jet_of[order]
    columns = {name: values[order] for name, values in columns.items()}
    position = np.arange(len(jet_of)) - np.repeat(np.cumsum(counts) - counts, counts)
    kept = position < max_constituents
    jet_of, position = jet_of[kept], position[kept]
    pt, eta, phi, mass, charge = (columns[name][kept] for name in CONSTITUENT_FIELDS)
    energy = _energy(pt, eta, mass)
    jet_pt, jet_eta, jet_phi, jet_energy = _jet_axes(columns, counts, jet_columns)
    deta = eta - jet_eta[jet_of]
    dphi = _wrap_phi(phi - jet_phi[jet_of])
    per_constituent = np.stack([
        _safe_log(pt), _safe_log(energy),
        _safe_log(pt / np.maximum(jet_pt[jet_of], _LOG_FLOOR)),
        _safe_log(energy / np.maximum(jet_energy[jet_of], _LOG_FLOOR)),
        deta, dphi, charge,
    ])
    inputs = _empty_particlenet_inputs(n_jets, max_constituents)
    inputs["pf_features"][jet_of, :, position] = per_constituent.T
    inputs["pf_points"][jet_of, :, position] = np.stack([deta, dphi]).T
    inputs["pf_mask"][jet_of, 0, position] = 1.0
    return inputs
