"""Example analysis: track finding as a service, on the sample's tracker hits.

What it computes and where it runs, with examples: docs/internals/examples.md.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import awkward as ak
import hist
import numpy as np
from coffea import processor

from ..data.hits import FIELD_T, hit_rows, hit_xyz
from ..errors import InputValidationError, MissingDependencyError
from ..processor import SonicMixin
from ..zoo import trackgnn

__all__ = ["TrackingProcessor", "compare_with_direct", "fitted_pt", "plot_tracking",
           "print_tracking_summary", "summarise_tracking"]

logger = logging.getLogger(__name__)

#: The per-dataset counters of the ``cutflow`` output.
COUNTERS = ("events", "hits", "true_tracks", "reco_tracks", "found", "matched")
#: Most hits of a track the histograms show (10 layers, plus noise hits a track may pick up).
MAX_TRACK_HITS = 15


def fitted_pt(x: np.ndarray, y: np.ndarray, track: np.ndarray, n_tracks: int) -> np.ndarray:
    """Transverse momentum (GeV) of each of ``n_tracks`` tracks from a least-squares circle
    through the origin and its hits (``track``: each hit's track, -1 for none), in the sample's
    field :data:`~coffea_sonic.data.hits.FIELD_T`; NaN for tracks under 2 hits.

    >>> phi = np.linspace(0.1, 1.0, 6)        # a circle of radius 100 cm through the origin
    >>> x, y = 100 * np.sin(phi), 100 - 100 * np.cos(phi)
    >>> fitted_pt(x, y, np.zeros(6, int), 1).round(3).tolist()   # 0.3 * 2 T * 1 m
    [0.6]
    """
    on = track >= 0
    x, y, track = x[on].astype(np.float64), y[on].astype(np.float64), track[on]
    r2 = x * x + y * y

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(track, weights=values, minlength=n_tracks)

    sxx, sxy, syy, sxr, syr = (total(v) for v in (x * x, x * y, y * y, x * r2, y * r2))
    det = sxx * syy - sxy * sxy
    with np.errstate(divide="ignore", invalid="ignore"):
        centre_x = (syy * sxr - sxy * syr) / (2 * det)
        centre_y = (sxx * syr - sxy * sxr) / (2 * det)
        radius_m = np.hypot(centre_x, centre_y) / 100.0
    return np.where(np.abs(det) > 0, 0.3 * FIELD_T * radius_m, np.nan)


class TrackingProcessor(SonicMixin, processor.ProcessorABC):
    """Track efficiency and purity of the served ``trackgnn`` pipeline, per dataset.

    ``server`` is ``triton+grpc://host:port`` (the model name is appended) or a mapping
    ``{model: url}``; ``ensemble=True`` asks ``trackgnn_ensemble`` (the Triton ensemble of the
    stages) instead of the fused ``trackgnn``: the same labels. ``model_options`` go to every
    :class:`~coffea_sonic.model.TritonModel` (``max_in_flight``, ``max_request_bytes``, ...).
    """

    def __init__(self, server: str | Mapping[str, str] = "triton+grpc://127.0.0.1:8001", *,
                 ensemble: bool = False, **model_options: Any) -> None:
        self.model = trackgnn.ENSEMBLE_NAME if ensemble else trackgnn.NAME
        if isinstance(server, str):
            models = {self.model: f"{server.rstrip('/')}/{self.model}"}
        else:
            models = dict(server)
        self.sonic_configure(models, **model_options)

    def track_labels(self, events: ak.Array) -> ak.Array:
        """The served track label of every hit, ``[events][hits]`` int64 aligned with
        ``events.Hit`` (-1: on no track)."""
        if type(events).__module__.startswith("dask_awkward"):
            raise NotImplementedError(
                "TrackingProcessor runs on eager chunks (processor.Runner), not under "
                "dask-awkward")
        if "Hit" not in ak.fields(events):
            raise InputValidationError(
                "TrackingProcessor needs the tracker hits (Hit_x, Hit_y, Hit_z, Hit_track_id) "
                "that `coffea-sonic sample` writes; these events have none (real NanoAOD has no "
                "tracker hits)")
        xyz = hit_xyz(events.Hit)
        return self.infer(self.model, {"hits": xyz}, like=xyz, ragged=True)["labels"]

    def process(self, events: ak.Array) -> dict[str, Any]:
        # NanoEvents carry their dataset; a plain awkward array of events has no metadata
        dataset = (getattr(events, "metadata", None) or {}).get("dataset", "unknown")
        labels = self.track_labels(events)
        rows, counts = hit_rows(events.Hit)
        track_id = ak.to_numpy(ak.flatten(events.Hit.track_id))
        matches = trackgnn.track_matches(ak.to_numpy(ak.flatten(labels)), track_id, counts)
        metrics = matches.metrics()
        output: dict[str, Any] = {
            "histograms": _histograms(dataset, rows, counts, matches),
            "cutflow": {dataset: {"events": len(counts), "hits": len(rows),
                                  "true_tracks": metrics.true_tracks,
                                  "reco_tracks": metrics.reco_tracks,
                                  "found": metrics.found, "matched": metrics.matched}},
            "inference": self.sonic_stats(),
        }
        return output

    def postprocess(self, accumulator: dict[str, Any]) -> dict[str, Any]:
        return accumulator


def _histograms(dataset: str, rows: np.ndarray, counts: np.ndarray,
                matches: trackgnn.TrackMatches) -> dict[str, hist.Hist]:
    dataset_axis = hist.axis.StrCategory([], growth=True, name="dataset")
    kind_axis = hist.axis.StrCategory(["true", "reconstructed"], name="kind")
    size_axis = hist.axis.Integer(0, MAX_TRACK_HITS + 1, name="hits", label="hits on the track")
    counted_size = hist.axis.Integer(trackgnn.MIN_TRACK_HITS, MAX_TRACK_HITS + 1, name="hits",
                                     label="hits on the track")
    per_event = hist.Hist(dataset_axis, hist.axis.Regular(50, 0, 500, name="hits",
                                                          label="hits per event"))
    tracks = hist.Hist(dataset_axis, kind_axis,
                       hist.axis.Regular(30, 0, 60, name="tracks", label="tracks per event"))
    sizes = hist.Hist(dataset_axis, kind_axis, size_axis)
    true_tracks = hist.Hist(dataset_axis, hist.axis.Boolean(name="found"), counted_size,
                            hist.axis.Regular(19, 0.5, 10.0, name="pt",
                                              label="true track pT, circle fit of its hits [GeV]"))
    reco_tracks = hist.Hist(dataset_axis, hist.axis.Boolean(name="matched"), counted_size)
    per_event.fill(dataset=dataset, hits=counts)
    true_counted = matches.true_size >= trackgnn.MIN_TRACK_HITS
    reco_counted = matches.reco_size >= trackgnn.MIN_TRACK_HITS
    for kind, event, counted, size in (
            ("true", matches.true_event, true_counted, matches.true_size),
            ("reconstructed", matches.reco_event, reco_counted, matches.reco_size)):
        tracks.fill(dataset=dataset, kind=kind,
                    tracks=np.bincount(event[counted], minlength=len(counts)))
        sizes.fill(dataset=dataset, kind=kind, hits=size)
    pt = fitted_pt(rows[:, 0], rows[:, 1], matches.true_of_hit, len(matches.true_size))
    true_tracks.fill(dataset=dataset, found=matches.true_found[true_counted],
                     hits=matches.true_size[true_counted], pt=pt[true_counted])
    reco_tracks.fill(dataset=dataset, matched=matches.reco_matched[reco_counted],
                     hits=matches.reco_size[reco_counted])
    return {"hits_per_event": per_event, "tracks_per_event": tracks, "track_size": sizes,
            "true_tracks": true_tracks, "reco_tracks": reco_tracks}


def summarise_tracking(output: Mapping[str, Any], wall_s: float,
                       workers: int = 1) -> dict[str, Any]:
    """The numbers the tracking demo prints: totals over datasets, efficiency (true tracks found
    / true tracks) and purity (reconstructed tracks matched / reconstructed tracks)."""
    totals = {name: sum(int(entry[name]) for entry in output["cutflow"].values())
              for name in COUNTERS}
    metrics = trackgnn.TrackMetrics(true_tracks=totals["true_tracks"],
                                    reco_tracks=totals["reco_tracks"], found=totals["found"],
                                    matched=totals["matched"])
    return {
        **totals,
        "efficiency": round(metrics.efficiency, 4),
        "purity": round(metrics.purity, 4),
        "wall_s": round(wall_s, 3),
        "events_per_s": round(totals["events"] / wall_s, 1) if wall_s > 0 else None,
        "workers": workers,
        "client": {name: stats.to_dict() for name, stats in output.get("inference", {}).items()},
        "cutflow": {name: {key: int(value) for key, value in entry.items()}
                    for name, entry in output["cutflow"].items()},
    }


def print_tracking_summary(summary: Mapping[str, Any]) -> None:
    """Print :func:`summarise_tracking`'s numbers (the demo's report).

    >>> print_tracking_summary(summarise_tracking({"cutflow": {"d": {"events": 2, "hits": 30,
    ...     "true_tracks": 4, "reco_tracks": 5, "found": 3, "matched": 4}}}, wall_s=1.0))
    ... # doctest: +NORMALIZE_WHITESPACE
    <BLANKLINE>
    === coffea-sonic tracking demo summary ===
    events                     2   (2 events/s, 1.0 s wall, 1 workers)
    hits                      30
    true tracks                4   (>= 5 hits)
    tracks found               5   reconstructed (>= 5 hits), 4 matched to a true track
    efficiency            0.7500   (3 of 4 true tracks found)
    purity                0.8000   (4 of 5 reconstructed tracks matched)
    """
    rate = summary["events_per_s"] or 0.0
    print("\n=== coffea-sonic tracking demo summary ===")
    print(f"events            {summary['events']:>10,d}   ({rate:,.0f} events/s, "
          f"{summary['wall_s']:.1f} s wall, {summary['workers']} workers)")
    print(f"hits              {summary['hits']:>10,d}")
    print(f"true tracks       {summary['true_tracks']:>10,d}   (>= {trackgnn.MIN_TRACK_HITS} hits)")
    print(f"tracks found      {summary['reco_tracks']:>10,d}   reconstructed (>= "
          f"{trackgnn.MIN_TRACK_HITS} hits), {summary['matched']:,d} matched to a true track")
    print(f"efficiency        {summary['efficiency']:>10.4f}   ({summary['found']:,d} of "
          f"{summary['true_tracks']:,d} true tracks found)")
    print(f"purity            {summary['purity']:>10.4f}   ({summary['matched']:,d} of "
          f"{summary['reco_tracks']:,d} reconstructed tracks matched)")
    for name, stats in summary["client"].items():
        print(f"{name:18s}{int(stats['rows']):>10,d} events' hits sent unpadded in "
              f"{int(stats['requests'])} requests, {stats['bytes_sent'] / 1e6:.1f} MB, "
              f"{stats['wait_s']:.1f} s waiting, {int(stats.get('fallback_rows', 0))} by fallback")


def compare_with_direct(tracking: TrackingProcessor, events: ak.Array,
                        device: str = "cpu") -> dict[str, Any]:
    """The served labels of ``events`` (through ``tracking``) against an in-process
    :func:`~coffea_sonic.zoo.trackgnn.run_direct` of the same hits on ``device``: events, hits,
    whether the labels are identical, the share of hits with the same label, both runs'
    efficiency and purity, and a one-line ``verdict``.

    >>> compare_with_direct  # doctest: +ELLIPSIS
    <function compare_with_direct at ...>
    """
    served = ak.to_numpy(ak.flatten(tracking.track_labels(events))).astype(np.int64)
    rows, counts = hit_rows(events.Hit)
    where = f"the first {len(counts)} events ({len(rows):,d} hits)"
    try:
        direct = trackgnn.run_direct(rows, counts, device)
    except MissingDependencyError as error:
        logger.warning("no in-process run to compare with: %s", error)
        return {"events": len(counts), "hits": len(rows), "identical": None,
                "verdict": f"not checked ({error})"}
    track_id = ak.to_numpy(ak.flatten(events.Hit.track_id))
    served_metrics = trackgnn.track_metrics(served, track_id, counts)
    direct_metrics = trackgnn.track_metrics(direct, track_id, counts)
    identical = bool(np.array_equal(served, direct))
    agreeing = float(np.mean(served == direct)) if len(rows) else 1.0
    if identical:
        verdict = (f"identical labels on {where}; efficiency {served_metrics.efficiency:.4f}, "
                   f"purity {served_metrics.purity:.4f} both ways")
    else:
        verdict = (f"{100 * agreeing:.2f} % of the hits of {where} have the same label; "
                   f"efficiency {served_metrics.efficiency:.4f} served, "
                   f"{direct_metrics.efficiency:.4f} direct ({device}); a GPU server runs "
                   "float32, a CPU run float64")
    return {"events": len(counts), "hits": len(rows), "identical": identical,
            "agreeing_hits": agreeing, "served": served_metrics.__dict__,
            "direct": direct_metrics.__dict__, "verdict": verdict}


def _ratio(passed: np.ndarray, total: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, passed / np.maximum(total, 1), np.nan)


def plot_tracking(output: Mapping[str, Any], path: str) -> str:
    """Save the tracking histograms as a PNG (hits and tracks per event, track sizes,
    efficiency against hits and pT, purity against hits); return its path.

    >>> plot_tracking  # doctest: +ELLIPSIS
    <function plot_tracking at ...>
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mplhep

    plt.style.use(mplhep.style.CMS)
    histograms = {name: h[{"dataset": sum}] for name, h in output["histograms"].items()}
    figure, axes = plt.subplots(2, 3, figsize=(27, 14))
    mplhep.histplot(histograms["hits_per_event"], ax=axes[0, 0], histtype="step", linewidth=2)
    axes[0, 0].set_title("hits per event", fontsize=18)
    for axis, name, title in ((axes[0, 1], "tracks_per_event",
                               f"tracks (>= {trackgnn.MIN_TRACK_HITS} hits) per event"),
                              (axes[0, 2], "track_size", "hits per track")):
        for kind in ("true", "reconstructed"):
            mplhep.histplot(histograms[name][{"kind": kind}], ax=axis, histtype="step",
                            linewidth=2, label=kind)
        axis.set_title(title, fontsize=18)
        axis.legend(fontsize=16)
    true_tracks, reco_tracks = histograms["true_tracks"], histograms["reco_tracks"]
    ratios = (
        (axes[1, 0], "efficiency vs hits of the true track",
         true_tracks[{"pt": sum}], "found", "hits"),
        (axes[1, 1], "efficiency vs true track pT", true_tracks[{"hits": sum}], "found", "pt"),
        (axes[1, 2], "purity vs hits of the reconstructed track", reco_tracks, "matched", "hits"),
    )
    for axis, title, histogram, flag, along in ratios:
        total = histogram[{flag: sum}].values()
        passed = histogram[{flag: True}].values()
        axis_of = histogram.axes[along]
        centres = axis_of.edges[:-1] if isinstance(axis_of, hist.axis.Integer) else axis_of.centers
        axis.errorbar(centres, _ratio(passed, total),
                      yerr=np.sqrt(_ratio(passed, total) * (1 - _ratio(passed, total))
                                   / np.maximum(total, 1)), marker="o", linestyle="none")
        axis.set_title(title, fontsize=18)
        axis.set_xlabel(axis_of.label)
        axis.set_ylim(0.0, 1.05)
    figure.tight_layout()
    figure.savefig(path, dpi=70)
    plt.close(figure)
    return path
