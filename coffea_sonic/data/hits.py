"""Synthetic tracker hits: a jagged NanoAOD-style ``Hit`` collection with true track ids.

The toy tracker, with an example: docs/internals/examples.md, "Tracker hits".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ConfigurationError

__all__ = ["HIT_BRANCH_DTYPES", "LAYER_RADII", "generate_hits", "hit_collection", "hit_rows",
           "hit_xyz"]

#: Radii (cm) of the barrel layers, innermost first.
LAYER_RADII: tuple[float, ...] = (3.0, 6.0, 10.0, 15.0, 21.0, 28.0, 36.0, 45.0, 55.0, 66.0)
#: Half-length (cm) of the barrel; hits beyond it are lost.
BARREL_HALF_LENGTH = 150.0
#: Solenoid field (T).
FIELD_T = 2.0
#: Probability that a track crossing a layer leaves a hit there.
HIT_EFFICIENCY = 0.97
#: Gaussian resolution (cm) in r-phi and z.
SMEAR_RPHI, SMEAR_Z = 0.01, 0.03
#: Noise hits per track hit (Poisson mean).
NOISE_FRACTION = 0.05
#: Share of events with no track (and so no hit).
EMPTY_EVENT_FRACTION = 0.05
#: Range of the per-event mean of the Poisson number of extra tracks.
TRACKS_MEAN_RANGE = (2.0, 30.0)
#: Track kinematics: pT = PT_MIN + Exponential(PT_SCALE) GeV, |eta| < ETA_MAX,
#: z0 ~ N(0, Z0_SIGMA) cm.
PT_MIN, PT_SCALE, ETA_MAX, Z0_SIGMA = 0.5, 1.5, 1.4, 5.0
#: Key of the hits' own random stream (kept apart from the rest of the sample).
HIT_STREAM = 0x417

#: ``Hit_<field>`` branches and their dtypes (``track_id``: index of the true track in the event,
#: -1 for noise; ``layer``: 0 innermost).
HIT_BRANCH_DTYPES: dict[str, str] = {
    "x": "float32",
    "y": "float32",
    "z": "float32",
    "layer": "uint8",
    "track_id": "int32",
}


def _tracks_per_event(rng: np.random.Generator, n_events: int) -> np.ndarray:
    low, high = TRACKS_MEAN_RANGE
    tracks = 1 + rng.poisson(rng.uniform(low, high, n_events))
    return np.where(rng.random(n_events) < EMPTY_EVENT_FRACTION, 0, tracks)


def generate_hits(n_events: int, seed: int = 0, stream: tuple[int, ...] = ()) -> dict[str, Any]:
    """Hits of ``n_events`` events: ``{"counts": [n_events] int64, "fields": {name: flat array}}``.

    Fields follow :data:`HIT_BRANCH_DTYPES`, event after event; ``stream`` extends the seed (the
    sample passes its dataset and first event).

    >>> a, b = generate_hits(20, seed=3), generate_hits(20, seed=3)
    >>> bool(np.array_equal(a["fields"]["x"], b["fields"]["x"]))
    True
    """
    if n_events < 0:
        raise ConfigurationError(f"generate_hits needs n_events >= 0, got {n_events}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, *stream, HIT_STREAM]))
    n_tracks = _tracks_per_event(rng, n_events)
    total = int(n_tracks.sum())
    pt = PT_MIN + rng.exponential(PT_SCALE, total)
    eta = rng.uniform(-ETA_MAX, ETA_MAX, total)
    phi0 = rng.uniform(-math.pi, math.pi, total)
    charge = rng.choice(np.array([-1.0, 1.0]), total)
    z0 = rng.normal(0.0, Z0_SIGMA, total)
    radius = pt / (0.3 * FIELD_T) * 100.0  # cm
    layers = np.asarray(LAYER_RADII)
    # [tracks, layers]: where each helix crosses each cylinder
    ratio = layers[None, :] / (2.0 * radius[:, None])
    turn = np.arcsin(np.clip(ratio, -1.0, 1.0))
    phi = phi0[:, None] - charge[:, None] * turn
    z = z0[:, None] + 2.0 * radius[:, None] * turn * np.sinh(eta)[:, None]
    phi = phi + rng.normal(0.0, SMEAR_RPHI, phi.shape) / layers[None, :]
    z = z + rng.normal(0.0, SMEAR_Z, z.shape)
    seen = ((rng.random(phi.shape) < HIT_EFFICIENCY) & (np.abs(z) < BARREL_HALF_LENGTH)
            & (ratio < 1.0))
    track_of = np.repeat(np.arange(total), len(layers)).reshape(phi.shape)
    event_of_track = np.repeat(np.arange(n_events), n_tracks)
    first_track = np.cumsum(n_tracks) - n_tracks
    track_hits = {
        "event": event_of_track[track_of][seen],
        "r": np.broadcast_to(layers, phi.shape)[seen],
        "phi": phi[seen],
        "z": z[seen],
        "layer": np.broadcast_to(np.arange(len(layers)), phi.shape)[seen],
        "track_id": (track_of - first_track[event_of_track][:, None])[seen],
    }
    noise = _noise_hits(rng, np.bincount(track_hits["event"], minlength=n_events), layers)
    merged = {key: np.concatenate([track_hits[key], noise[key]]) for key in track_hits}
    order = np.lexsort((rng.random(len(merged["event"])), merged["event"]))
    merged = {key: values[order] for key, values in merged.items()}
    fields = {"x": merged["r"] * np.cos(merged["phi"]), "y": merged["r"] * np.sin(merged["phi"]),
              "z": merged["z"], "layer": merged["layer"], "track_id": merged["track_id"]}
    return {"counts": np.bincount(merged["event"], minlength=n_events).astype(np.int64),
            "fields": {name: np.asarray(fields[name]).astype(dtype)
                       for name, dtype in HIT_BRANCH_DTYPES.items()}}


def _noise_hits(rng: np.random.Generator, per_event: np.ndarray,
                layers: np.ndarray) -> dict[str, np.ndarray]:
    """Noise hits: per event a Poisson number in proportion to its track hits, uniform on the
    layers' cylinders, ``track_id`` -1."""
    n_noise = rng.poisson(NOISE_FRACTION * per_event)
    noise_event = np.repeat(np.arange(len(per_event)), n_noise)
    noise_layer = rng.integers(0, len(layers), len(noise_event))
    return {
        "event": noise_event,
        "r": layers[noise_layer],
        "phi": rng.uniform(-math.pi, math.pi, len(noise_event)),
        "z": rng.uniform(-BARREL_HALF_LENGTH, BARREL_HALF_LENGTH, len(noise_event)),
        "layer": noise_layer,
        "track_id": np.full(len(noise_event), -1),
    }


def hit_collection(n_events: int, seed: int = 0, stream: tuple[int, ...] = ()):
    """The hits of :func:`generate_hits` as a jagged awkward record array ``[events][hits]``.

    >>> hits = hit_collection(4, seed=2)
    >>> len(hits), hits.fields
    (4, ['x', 'y', 'z', 'layer', 'track_id'])
    """
    import awkward as ak

    drawn = generate_hits(n_events, seed, stream)
    return ak.unflatten(ak.zip(drawn["fields"]), drawn["counts"])


def hit_rows(hits: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(rows [sum(counts), 3] float32 of x, y, z, counts [events] int64)`` of a jagged ``Hit``
    collection (``events.Hit`` of NanoEvents, or :func:`hit_collection`), the input of
    ``trackgnn``.

    >>> rows, counts = hit_rows(hit_collection(3, seed=2))
    >>> rows.shape[1], rows.dtype, int(counts.sum()) == len(rows)
    (3, dtype('float32'), True)
    """
    import awkward as ak

    counts = ak.to_numpy(ak.num(hits, axis=1)).astype(np.int64)
    rows = np.stack([ak.to_numpy(ak.flatten(hits[name])).astype(np.float32)
                     for name in ("x", "y", "z")], axis=1)
    return rows.reshape(len(rows), 3), counts


def hit_xyz(hits: Any):
    """The ``trackgnn`` input as a jagged array ``[events][hits][3]`` float32 (x, y, z) of a
    ``Hit`` collection: what ``self.infer("trackgnn", {"hits": xyz}, like=xyz, ragged=True)``
    sends from a processor.

    >>> xyz = hit_xyz(hit_collection(3, seed=2))
    >>> str(xyz.type).split(" * ", 1)[1]
    'var * 3 * float32'
    """
    import awkward as ak

    rows, counts = hit_rows(hits)
    return ak.unflatten(ak.Array(rows), counts)
