"""``trackgnn``: an Exa.TrkX-like tracking pipeline (hits -> a track label per hit), and its metrics.

Stages, ways to run it and the metrics' definitions: docs/internals/zoo.md, "The trackgnn
pipeline" (with an example of the metrics).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputValidationError, ModelNotFoundError, require

__all__ = ["MATCH_FRACTION", "MIN_TRACK_HITS", "NAME", "ENSEMBLE_NAME", "SERVED_NAMES", "STAGE_MODELS",
           "TrackMatches", "TrackMetrics", "pipeline", "run_direct", "track_matches",
           "track_metrics", "weights_path"]

logger = logging.getLogger(__name__)

#: The fused served model, the ensemble, and the ensemble's stage models.
NAME = "trackgnn"
ENSEMBLE_NAME = "trackgnn_ensemble"
#: What a user names to serve the pipeline (the stage models come with the ensemble).
SERVED_NAMES: tuple[str, ...] = (NAME, ENSEMBLE_NAME)
STAGE_MODELS: tuple[str, ...] = tuple(f"trackgnn_{stage}" for stage in
                                      ("embed", "graph", "filter", "gnn", "cc"))
#: Hits a true or reconstructed track needs to count in the metrics.
MIN_TRACK_HITS = 5
#: Shared-hit fraction (of both the true track and the label) for a match.
MATCH_FRACTION = 0.75
#: Description shown by ``coffea-sonic models list``.
DESCRIPTION = ("Exa.TrkX-like tracking pipeline: embedding MLP -> neighbour graph -> edge filter "
               "-> GNN edge classifier -> connected components; ragged hits [-1, 3] with "
               "hits__counts -> labels [-1] per hit (served fused as trackgnn and as the Triton "
               "ensemble trackgnn_ensemble); trained here on the sample's hits")

_pipelines: dict[str, Any] = {}
_lock = threading.Lock()


def weights_path() -> Path:
    """The shipped weights (``trackgnn.npz``, package data).

    >>> weights_path().name
    'trackgnn.npz'
    """
    path = Path(str(resources.files(__package__) / "trackgnn.npz"))
    if not path.is_file():
        raise ModelNotFoundError(f"package data {path} is missing; reinstall coffea-sonic or run "
                                 "`python -m zoo_training.trackgnn_train` in a checkout's scripts/")
    return path


def pipeline(device: str = "cpu") -> Any:
    """The trained :class:`~coffea_sonic.zoo.trackgnn_pipeline.TrackPipeline` on ``device``
    (cached per device; needs torch).

    >>> pipeline("cpu").hparams["min_hits"] >= 2
    True
    """
    with _lock:
        if device not in _pipelines:
            require("torch", "trackgnn (torch on CPU or CUDA)")
            from .trackgnn_pipeline import TrackPipeline, load_weights

            _pipelines[device] = TrackPipeline(load_weights(str(weights_path())), device)
        return _pipelines[device]


def _check_rows(hits: Any, counts: Any) -> tuple[np.ndarray, np.ndarray]:
    rows = np.asarray(hits)
    if rows.ndim != 2 or rows.shape[1] != 3:
        raise InputValidationError(f"trackgnn: expected hits [rows, 3] (x, y, z in cm), got shape "
                                   f"{list(rows.shape)}")
    counts = (np.array([len(rows)], dtype=np.int64) if counts is None
              else np.asarray(counts).astype(np.int64).reshape(-1))
    if (counts < 0).any() or int(counts.sum()) != len(rows):
        raise InputValidationError(
            f"trackgnn: counts (rows per event) must be >= 0 and sum to the {len(rows)} rows of "
            f"hits; they sum to {int(counts.sum())}")
    return rows.astype(np.float32, copy=False), counts


def run_direct(hits: Any, counts: Any = None, device: str = "cpu") -> np.ndarray:
    """Track labels ``[rows]`` int64 of ``hits [rows, 3]`` (x, y, z; cm) in-process, with
    ``counts`` rows per event (None: one event); the code the served models run.

    >>> from coffea_sonic.data.hits import generate_hits
    >>> drawn = generate_hits(3, seed=5)
    >>> f = drawn["fields"]
    >>> rows = np.stack([f["x"], f["y"], f["z"]], axis=1)
    >>> labels = run_direct(rows, drawn["counts"])
    >>> labels.shape == (len(rows),), labels.dtype
    (True, dtype('int64'))
    """
    rows, counts = _check_rows(hits, counts)
    return pipeline(device).run(rows, counts)


@dataclass(frozen=True)
class TrackMetrics:
    """Tracking performance over some events (definitions: docs/internals/zoo.md, "Metrics")."""

    true_tracks: int
    reco_tracks: int
    found: int
    matched: int

    @property
    def efficiency(self) -> float:
        return self.found / self.true_tracks if self.true_tracks else float("nan")

    @property
    def purity(self) -> float:
        return self.matched / self.reco_tracks if self.reco_tracks else float("nan")


@dataclass(frozen=True)
class TrackMatches:
    """Per-track outcome of :func:`track_matches`: every true track and every reconstructed
    track (label), whatever its size; the metrics count those of at least
    :data:`MIN_TRACK_HITS` hits.

    ``true_event`` / ``reco_event``: the event of each track; ``true_size`` / ``reco_size``: its
    hits; ``true_found`` / ``reco_matched``: matched (docs/internals/zoo.md); ``true_of_hit`` /
    ``reco_of_hit``: per hit, the index of its true / reconstructed track in these arrays (-1:
    noise / on no track).

    >>> matches = track_matches(np.array([0] * 5 + [1] * 2), np.array([0] * 5 + [1] * 2), [7])
    >>> matches.true_size.tolist(), matches.reco_matched.tolist(), matches.metrics().true_tracks
    ([5, 2], [True, True], 1)
    """

    true_event: np.ndarray
    true_size: np.ndarray
    true_found: np.ndarray
    true_of_hit: np.ndarray
    reco_event: np.ndarray
    reco_size: np.ndarray
    reco_matched: np.ndarray
    reco_of_hit: np.ndarray

    def metrics(self) -> TrackMetrics:
        """The totals over tracks of at least :data:`MIN_TRACK_HITS` hits."""
        true_counted = self.true_size >= MIN_TRACK_HITS
        reco_counted = self.reco_size >= MIN_TRACK_HITS
        return TrackMetrics(true_tracks=int(true_counted.sum()),
                            reco_tracks=int(reco_counted.sum()),
                            found=int((self.true_found & true_counted).sum()),
                            matched=int((self.reco_matched & reco_counted).sum()))


def _tracks(key: np.ndarray, stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Track keys (sorted), their event, size, and each hit's index among them (-1: none)."""
    ids, of_hit, size = np.unique(key, return_inverse=True, return_counts=True)
    if len(ids) and ids[0] < 0:  # hits on no track share key -1
        ids, size, of_hit = ids[1:], size[1:], of_hit.reshape(-1) - 1
    return ids, ids // stride, size, of_hit.reshape(-1)


def track_matches(labels: Any, track_id: Any, counts: Any) -> TrackMatches:
    """Which true tracks are found and which reconstructed tracks are matched, per track, for
    per-event ``labels`` against true ``track_id`` (both ``[rows]``, -1 for none), the events'
    rows given by ``counts``.

    >>> matches = track_matches(np.array([0, 0, 0, -1]), np.array([0, 0, 0, 1]), np.array([4]))
    >>> matches.true_size.tolist(), matches.true_found.tolist(), matches.reco_of_hit.tolist()
    ([3, 1], [True, False], [0, 0, 0, -1])
    """
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    track_id = np.asarray(track_id, dtype=np.int64).reshape(-1)
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    if len(labels) != len(track_id) or int(counts.sum()) != len(labels):
        raise InputValidationError(
            f"track_metrics: labels ({len(labels)}), track_id ({len(track_id)}) and the sum of "
            f"counts ({int(counts.sum())}) must all be the number of hits")
    event = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    stride = int(max(labels.max(initial=0), track_id.max(initial=0))) + 2
    true_key = np.where(track_id >= 0, event * stride + track_id, -1)
    reco_key = np.where(labels >= 0, event * stride + labels, -1)
    true_ids, true_event, true_size, true_of_hit = _tracks(true_key, stride)
    reco_ids, reco_event, reco_size, reco_of_hit = _tracks(reco_key, stride)
    both = (true_key >= 0) & (reco_key >= 0)
    pairs, shared = np.unique(np.stack([true_key[both], reco_key[both]], axis=1), axis=0,
                              return_counts=True)
    pairs = pairs.reshape(-1, 2)
    pair_true = true_size[np.searchsorted(true_ids, pairs[:, 0])]
    pair_reco = reco_size[np.searchsorted(reco_ids, pairs[:, 1])]
    match = (shared >= MATCH_FRACTION * pair_true) & (shared >= MATCH_FRACTION * pair_reco)
    return TrackMatches(true_event=true_event, true_size=true_size,
                        true_found=np.isin(true_ids, pairs[match, 0]), true_of_hit=true_of_hit,
                        reco_event=reco_event, reco_size=reco_size,
                        reco_matched=np.isin(reco_ids, pairs[match, 1]), reco_of_hit=reco_of_hit)


def track_metrics(labels: Any, track_id: Any, counts: Any) -> TrackMetrics:
    """Efficiency and purity of per-event ``labels`` against true ``track_id`` (both ``[rows]``,
    -1 for none), the events' rows given by ``counts``.

    >>> m = track_metrics(np.array([0] * 6 + [-1] * 4), np.array([3] * 10), np.array([10]))
    >>> m.found, m.matched, m.efficiency, m.purity   # 6 of 10 hits: under 75 % of the true track
    (0, 0, 0.0, 0.0)
    """
    return track_matches(labels, track_id, counts).metrics()
