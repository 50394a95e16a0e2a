"""Train ``trackgnn`` stage by stage on the synthetic sample's hits (CPU, about a minute).

1. embedding: hinge loss over every ordered pair of hits of an event going outwards in r: pairs
   of the same true track one or two layers apart are pulled together, pairs of different tracks
   (or noise) pushed beyond a margin of 1; the graph radius is then the 99.5th percentile of
   the true pairs' distances;
2. filter: binary cross-entropy on the graph's edges (true: both hits on the same track);
3. GNN: binary cross-entropy on the filtered edges, a batch of events' graphs at a time.

Every stage uses the zoo's one training loop (:func:`zoo_training.train.fit`) and seeded
shuffling. ``python -m zoo_training.trackgnn_train`` (from ``scripts/``) writes the shipped ``trackgnn.npz`` and
logs the edge and track efficiencies and purities on fresh events.

>>> weights, report = train_trackgnn(n_events=40, epochs=(1, 1, 1), n_validation=10)
>>> sorted(report) == ["efficiency", "purity", "radius"] and "hparam.radius" in weights
True
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from coffea_sonic.data.hits import generate_hits
from coffea_sonic.errors import InputValidationError, require
from coffea_sonic.zoo import trackgnn_pipeline as tp
from coffea_sonic.zoo.trackgnn import track_metrics

from .train import fit

logger = logging.getLogger(__name__)

#: Seed offset of validation events.
VALIDATION_SEED_OFFSET = 1_000_003
#: Shipped model: training events and epochs of (embedding, filter, GNN).
TRAIN_EVENTS = 1200
EPOCHS = (6, 4, 8)


def _events(n_events: int, seed: int) -> dict[str, np.ndarray]:
    drawn = generate_hits(n_events, seed=seed, stream=(0xA11,))
    fields = drawn["fields"]
    return {"rows": np.stack([fields["x"], fields["y"], fields["z"]], axis=1),
            "counts": drawn["counts"], "track_id": fields["track_id"].astype(np.int64),
            "layer": fields["layer"].astype(np.int64)}


def _padded(events: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    counts = events["counts"]
    width = int(counts.max(initial=1))
    column = np.arange(width)
    valid = column[None, :] < counts[:, None]
    index = np.where(valid, (np.cumsum(counts) - counts)[:, None] + column[None, :], 0)
    return {"rows": events["rows"][index], "valid": valid,
            "track_id": np.where(valid, events["track_id"][index], -2),
            "layer": events["layer"][index]}


def _train_embedding(torch: Any, nets: Any, events: dict[str, np.ndarray], epochs: int,
                     seed: int) -> None:
    padded = {name: torch.from_numpy(value) for name, value in _padded(events).items()}
    counts = events["counts"]

    def loss_of(batch: Any) -> Any:
        width = max(int(counts[batch.numpy()].max()), 1)
        rows = padded["rows"][batch, :width]
        valid = padded["valid"][batch, :width]
        track = padded["track_id"][batch, :width]
        layer = padded["layer"][batch, :width]
        size = rows.shape
        points = nets["embed"](tp.features(rows.reshape(-1, 3))).reshape(size[0], size[1], -1)
        distance2 = ((points[:, :, None, :] - points[:, None, :, :]) ** 2).sum(dim=3)
        gap = layer[:, None, :] - layer[:, :, None]
        pair = valid[:, :, None] & valid[:, None, :] & (gap >= 1)
        same = (track[:, :, None] == track[:, None, :]) & (track[:, :, None] >= 0)
        positive = pair & same & (gap <= 2)
        negative = pair & ~same
        hinge = torch.relu(1.0 - torch.sqrt(distance2[negative] + 1e-9)) ** 2
        return (distance2[positive].sum() + hinge.sum()) / max(int(positive.sum()), 1)

    fit(nets["embed"], loss_of, len(counts), epochs=epochs, batch_size=8, learning_rate=2e-3,
        seed=seed, name="trackgnn embedding")


def _pipeline(nets: Any, hparams: dict[str, float]) -> tp.TrackPipeline:
    weights = {f"net.{key}": value.detach().numpy().copy()
               for key, value in nets.state_dict().items()}
    weights.update({f"hparam.{key}": np.array(value) for key, value in hparams.items()})
    return tp.TrackPipeline(weights, "cpu")


def _true(edges: np.ndarray, track_id: np.ndarray) -> np.ndarray:
    a, b = track_id[edges[:, 0]], track_id[edges[:, 1]]
    return (a == b) & (a >= 0)


def _pick_radius(torch: Any, nets: Any, events: dict[str, np.ndarray]) -> float:
    """The 99.5th percentile of the embedding distance of true pairs one or two layers apart."""
    with torch.no_grad():
        points = nets["embed"](tp.features(torch.from_numpy(events["rows"]))).numpy()
    event = np.repeat(np.arange(len(events["counts"])), events["counts"])
    key = np.where(events["track_id"] >= 0, event * 100_000 + events["track_id"], -1)
    order = np.lexsort((events["layer"], key))
    first, second = order[:-1], order[1:]
    same = (key[first] == key[second]) & (key[first] >= 0)
    distance = np.linalg.norm(points[first[same]] - points[second[same]], axis=1)
    return float(np.percentile(distance, 99.5))


def train_trackgnn(n_events: int = TRAIN_EVENTS, seed: int = 0,
                   epochs: tuple[int, int, int] = EPOCHS, n_validation: int = 300,
                   threads: int | None = 2) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Train the three networks; return ``(weights, report)``: the ``.npz`` arrays and
    ``{"efficiency", "purity", "radius"}`` measured on ``n_validation`` fresh events."""
    torch = require("torch", "training trackgnn")
    if n_events < 16 or min(epochs) < 1:
        raise InputValidationError(f"need n_events >= 16 and epochs >= 1, got {n_events}, {epochs}")
    if threads:
        torch.set_num_threads(threads)
    started = time.perf_counter()
    torch.manual_seed(seed)
    events = _events(n_events, seed)
    nets = tp.build_networks()
    _train_embedding(torch, nets, events, epochs[0], seed)
    hparams = dict(tp.DEFAULT_HPARAMS)
    hparams["radius"] = _pick_radius(torch, nets, events)

    # filter: every graph edge of the training events
    stage = _pipeline(nets, hparams)
    with torch.no_grad():
        rows = stage._hits(events["rows"])
        embedding = stage.embed(rows)
        edges = stage.graph(rows, embedding, events["counts"])
    truth = torch.from_numpy(_true(edges.numpy(), events["track_id"]).astype(np.float32))
    feats = tp.features(torch.from_numpy(events["rows"]))
    geometry = tp.edge_features(torch.from_numpy(events["rows"]), edges)
    logger.info("trackgnn graph: %d edges, %.4f true; %.4f of true pairs one or two layers "
                "apart inside the radius %.3f", len(edges), float(truth.mean()),
                _edge_efficiency(edges.numpy(), events), hparams["radius"])
    positive_weight = torch.tensor(float((1 - truth).sum() / max(truth.sum(), 1)))
    filter_loss = torch.nn.BCEWithLogitsLoss(pos_weight=positive_weight)
    fit(nets["filter"], lambda batch: filter_loss(
        tp.filter_logits(nets, feats, embedding, edges[batch], geometry[batch]), truth[batch]),
        len(edges), epochs=epochs[1], batch_size=2048, learning_rate=2e-3, seed=seed,
        name="trackgnn filter")

    # GNN: the filtered graph of each event
    stage = _pipeline(nets, hparams)
    with torch.no_grad():
        kept = stage.filter(rows, embedding, edges).numpy()
    _train_gnn(torch, nets, events, kept, epochs[2], seed)
    weights = {f"net.{key}": value.detach().numpy().astype(np.float32)
               for key, value in nets.state_dict().items()}
    weights.update({f"hparam.{key}": np.array(value, dtype=np.float64)
                    for key, value in hparams.items()})
    report = evaluate(weights, n_validation, seed + VALIDATION_SEED_OFFSET)
    report["radius"] = hparams["radius"]
    logger.info("trained trackgnn on %d events in %.1f s: track efficiency %.4f, purity %.4f on "
                "%d fresh events", n_events, time.perf_counter() - started, report["efficiency"],
                report["purity"], n_validation)
    return weights, report


def _edge_efficiency(edges: np.ndarray, events: dict[str, np.ndarray]) -> float:
    """Share of consecutive same-track hit pairs that are edges (either direction)."""
    event = np.repeat(np.arange(len(events["counts"])), events["counts"])
    key = np.where(events["track_id"] >= 0, event * 100_000 + events["track_id"], -1)
    order = np.lexsort((events["layer"], key))
    first, second = order[:-1], order[1:]
    same = (key[first] == key[second]) & (key[first] >= 0)
    wanted = {(int(a), int(b)) for a, b in zip(first[same], second[same])}
    have = {(int(a), int(b)) for a, b in edges} | {(int(b), int(a)) for a, b in edges}
    return len(wanted & have) / max(len(wanted), 1)


def _train_gnn(torch: Any, nets: Any, events: dict[str, np.ndarray], edges: np.ndarray,
               epochs: int, seed: int) -> None:
    counts = events["counts"]
    starts = np.cumsum(counts) - counts
    event_of_edge = np.repeat(np.arange(len(counts)), counts)[edges[:, 0]] if len(edges) else \
        np.zeros(0, dtype=np.int64)
    bounds = np.searchsorted(event_of_edge, np.arange(len(counts) + 1))
    rows = torch.from_numpy(events["rows"])
    truth_all = _true(edges, events["track_id"]).astype(np.float32)
    positive_weight = torch.tensor(float((1 - truth_all).sum() / max(truth_all.sum(), 1)))
    loss_function = torch.nn.BCEWithLogitsLoss(pos_weight=positive_weight)

    def loss_of(batch: Any) -> Any:
        hit_parts, edge_parts, truth_parts, offset = [], [], [], 0
        for event in batch.tolist():
            first, stop = int(starts[event]), int(starts[event] + counts[event])
            hit_parts.append(rows[first:stop])
            part = edges[bounds[event]:bounds[event + 1]]
            edge_parts.append(torch.from_numpy(part - first + offset))
            truth_parts.append(torch.from_numpy(truth_all[bounds[event]:bounds[event + 1]]))
            offset += stop - first
        hits, graph = torch.cat(hit_parts), torch.cat(edge_parts)
        logits = tp.gnn_scores(nets, tp.features(hits), graph, tp.edge_features(hits, graph))
        return loss_function(logits, torch.cat(truth_parts))

    gnn = torch.nn.ModuleDict({key: nets[key] for key in nets if key.startswith("gnn")})
    fit(gnn, loss_of, len(counts), epochs=epochs, batch_size=16, learning_rate=2e-3, seed=seed,
        name="trackgnn gnn")


def evaluate(weights: dict[str, np.ndarray], n_events: int, seed: int) -> dict[str, float]:
    """Track efficiency and purity of ``weights`` on ``n_events`` fresh events (CPU)."""
    events = _events(n_events, seed)
    labels = tp.TrackPipeline(weights, "cpu").run(events["rows"], events["counts"])
    metrics = track_metrics(labels, events["track_id"], events["counts"])
    return {"efficiency": metrics.efficiency, "purity": metrics.purity}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(tp.__file__).with_name("trackgnn.npz")))
    parser.add_argument("--events", type=int, default=TRAIN_EVENTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    weights, report = train_trackgnn(n_events=args.events)
    np.savez(args.out, **weights)
    logger.info("wrote %s: %s", args.out, report)


if __name__ == "__main__":
    main()
