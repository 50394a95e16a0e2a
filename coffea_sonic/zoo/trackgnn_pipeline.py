"""The numeric code of the ``trackgnn`` pipeline: one module, run in-process and by the server.

Self-contained on purpose (numpy and plain torch, scipy when present; no coffea_sonic import):
the repository writer copies it next to every served trackgnn model. The stages and their
numerics, with examples: docs/internals/zoo.md, "The stages".
"""

from __future__ import annotations

import math
import time
from typing import Any, Mapping

import numpy as np

if __package__:
    from .trackgnn_labels import (canonical_labels, connected_components, forest_labels,
                                  forest_roots)
else:  # copied beside a served model.py, whose folder is on sys.path
    from trackgnn_labels import (canonical_labels, connected_components,  # type: ignore
                                 forest_labels, forest_roots)

#: Dimensions of the learned embedding.
EMBEDDING_DIM = 8
#: Rounds of message passing of the GNN.
GNN_STEPS = 3
#: Hidden width of the MLPs (embedding, filter) and of the GNN's node/edge states.
HIDDEN = 64
GNN_HIDDEN = 32
#: Scales (cm) that bring x, y, r and z to O(1).
R_SCALE, Z_SCALE = 70.0, 150.0
#: Per-hit features the networks see (from x, y, z).
FEATURES = ("x", "y", "z", "r", "cos_phi", "sin_phi", "z_over_r")
#: Geometric features of an edge (from both hits' x, y, z): r and z steps, the phi step, the z at
#: r = 0 of the line through both hits, the curvature of the circle through the origin and both
#: hits (1 / R for a track from the origin with helix radius R; R > 83 cm in the sample).
EDGE_FEATURES = ("dr", "dz", "dphi", "z0", "curvature", "d_z_over_r")
#: An edge goes outwards: its target at least this much further out in r (cm).
MIN_DR = 0.5
#: Largest padded pair matrix (events x hits x hits) the graph stage builds at once, on CPU and
#: on a GPU (fewer, larger launches).
PAIR_BUDGET = 1 << 22
GPU_PAIR_BUDGET = 1 << 26
#: Hyper-parameters stored with the weights (``hparam.<name>``), with their defaults.
DEFAULT_HPARAMS: dict[str, float] = {"radius": 1.0, "k_max": 8, "filter_cut": 0.1,
                                     "gnn_cut": 0.5, "min_hits": 3}
#: The stages in order, and the tensors each reads and writes (name, Triton datatype, per-row
#: dims): the ensemble's stage models are declared from these.
STAGES: tuple[str, ...] = ("embed", "graph", "filter", "gnn", "cc")
_HITS = ("hits", "FP32", (3,))
_COUNTS = ("hits__counts", "INT64", ())
_EMBEDDING = ("embedding", "FP32", (EMBEDDING_DIM,))
STAGE_TENSORS: dict[str, tuple[tuple, tuple]] = {
    "embed": ((_HITS,), (_EMBEDDING,)),
    "graph": ((_HITS, _EMBEDDING, _COUNTS), (("graph_edges", "INT64", (2,)),)),
    "filter": ((_HITS, _EMBEDDING, ("graph_edges", "INT64", (2,))),
               (("filter_edges", "INT64", (2,)),)),
    "gnn": ((_HITS, ("filter_edges", "INT64", (2,))), (("gnn_edges", "INT64", (2,)),)),
    "cc": ((_HITS, ("gnn_edges", "INT64", (2,)), _COUNTS), (("labels", "INT64", ()),)),
}


def _mlp(torch: Any, sizes: tuple[int, ...]) -> Any:
    layers: list = []
    for index, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(n_in, n_out))
        if index < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def build_networks() -> Any:
    """The trainable networks (a ``torch.nn.ModuleDict``), untrained."""
    import torch

    n_features = len(FEATURES)
    return torch.nn.ModuleDict({
        "embed": _mlp(torch, (n_features, HIDDEN, HIDDEN, EMBEDDING_DIM)),
        "filter": _mlp(torch, (2 * n_features + 2 * EMBEDDING_DIM + len(EDGE_FEATURES), HIDDEN,
                               HIDDEN, 1)),
        "gnn_node": _mlp(torch, (n_features, GNN_HIDDEN, GNN_HIDDEN)),
        "gnn_edge": _mlp(torch, (2 * GNN_HIDDEN + len(EDGE_FEATURES), GNN_HIDDEN, GNN_HIDDEN)),
        "gnn_edge_update": _mlp(torch, (3 * GNN_HIDDEN, GNN_HIDDEN, GNN_HIDDEN)),
        "gnn_node_update": _mlp(torch, (3 * GNN_HIDDEN, GNN_HIDDEN, GNN_HIDDEN)),
        "gnn_classify": _mlp(torch, (3 * GNN_HIDDEN, GNN_HIDDEN, 1)),
    })


def features(hits: Any) -> Any:
    """Per-hit features ``[R, len(FEATURES)]`` (torch, the dtype of ``hits``)."""
    import torch

    x, y, z = hits[:, 0], hits[:, 1], hits[:, 2]
    r = torch.sqrt(x * x + y * y)
    safe_r = torch.clamp(r, min=1e-3)
    return torch.stack([x / R_SCALE, y / R_SCALE, z / Z_SCALE, r / R_SCALE, x / safe_r,
                        y / safe_r, z / (safe_r + 1.0) / 4.0], dim=1)


def edge_features(hits: Any, edges: Any) -> Any:
    """Per-edge geometric features ``[E, len(EDGE_FEATURES)]`` (torch, the dtype of ``hits``)."""
    import torch

    a, b = hits[edges[:, 0]], hits[edges[:, 1]]
    r_a = torch.sqrt(a[:, 0] ** 2 + a[:, 1] ** 2)
    r_b = torch.sqrt(b[:, 0] ** 2 + b[:, 1] ** 2)
    dr = r_b - r_a
    dz = b[:, 2] - a[:, 2]
    cross = a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]
    dot = a[:, 0] * b[:, 0] + a[:, 1] * b[:, 1]
    dphi = torch.atan2(cross, dot)
    chord = torch.sqrt((b[:, 0] - a[:, 0]) ** 2 + (b[:, 1] - a[:, 1]) ** 2)
    curvature = 2.0 * cross / torch.clamp(r_a * r_b * chord, min=1e-6)
    safe_dr = torch.where(dr.abs() < 1e-3, torch.full_like(dr, 1e-3), dr)
    z0 = a[:, 2] - r_a * dz / safe_dr
    over = b[:, 2] / (r_b + 1.0) - a[:, 2] / (r_a + 1.0)
    return torch.stack([dr / 20.0, dz / 20.0, dphi * 10.0, torch.clamp(z0 / 10.0, -10.0, 10.0),
                        curvature * 100.0, over * 4.0], dim=1)


def gnn_scores(nets: Any, feats: Any, edges: Any, geometry: Any) -> Any:
    """Edge logits of the interaction network on ``edges [E, 2]`` with their
    :func:`edge_features` ``geometry`` (torch)."""
    import torch

    source, target = edges[:, 0], edges[:, 1]
    node = nets["gnn_node"](feats)
    edge = nets["gnn_edge"](torch.cat([node[source], node[target], geometry], dim=1))
    for _ in range(GNN_STEPS):
        incoming = torch.zeros_like(node).index_add_(0, target, edge)
        outgoing = torch.zeros_like(node).index_add_(0, source, edge)
        node = node + nets["gnn_node_update"](torch.cat([node, incoming, outgoing], dim=1))
        edge = edge + nets["gnn_edge_update"](torch.cat([node[source], node[target], edge], dim=1))
    return nets["gnn_classify"](torch.cat([node[source], node[target], edge], dim=1)).squeeze(1)


def filter_logits(nets: Any, feats: Any, embedding: Any, edges: Any, geometry: Any) -> Any:
    """Edge logits of the filter MLP on ``edges [E, 2]`` with their :func:`edge_features`
    ``geometry`` (torch)."""
    import torch

    source, target = edges[:, 0], edges[:, 1]
    return nets["filter"](torch.cat([feats[source], feats[target], embedding[source],
                                     embedding[target], geometry], dim=1)).squeeze(1)


def best_outgoing(edges: Any, scores: Any, cut: float, rows: int) -> Any:
    """The edges scoring over ``cut`` that are the best-scoring outgoing edge of their source
    (the first of equal best ones): each hit links to at most one hit further out, so a wrong
    edge beside a right one cannot merge two tracks into one component (order kept).

    >>> import torch
    >>> edges = torch.tensor([[0, 1], [0, 2], [1, 2], [1, 3]])
    >>> best_outgoing(edges, torch.tensor([1.0, 1.0, 0.7, 0.9]), 0.5, 4).tolist()
    [[0, 1], [1, 3]]
    """
    import torch

    fill = torch.full((rows,), -math.inf, dtype=scores.dtype, device=scores.device)
    best = fill.scatter_reduce(0, edges[:, 0], scores, reduce="amax")
    kept = edges[(scores > cut) & (scores == best[edges[:, 0]])]
    # equal best scores (a float32 sigmoid is exactly 1 past a logit of about 17) would give a
    # hit two links outwards, and the labelling would leave the GPU for the host's general
    # connected components: keep the first (edges come in (source, target) order)
    if len(kept) > 1:
        first = torch.ones(len(kept), dtype=torch.bool, device=kept.device)
        first[1:] = kept[1:, 0] != kept[:-1, 0]
        kept = kept[first]
    return kept


def pair_chunks(counts: np.ndarray, budget: int = PAIR_BUDGET) -> list[tuple[int, int]]:
    """Consecutive groups of events whose padded pair matrices hold at most ``budget`` entries
    (an event over it alone).

    >>> pair_chunks(np.array([3, 3, 10, 0]), budget=30)
    [(0, 2), (2, 3), (3, 4)]
    """
    chunks: list[tuple[int, int]] = []
    start, widest = 0, 0
    for index, count in enumerate(np.asarray(counts).tolist()):
        wider = max(widest, int(count))
        if index > start and (index + 1 - start) * wider * wider > budget:
            chunks.append((start, index))
            start, wider = index, int(count)
        widest = wider
    if len(counts):
        chunks.append((start, len(counts)))
    return chunks


class _StageClock:
    """Milliseconds since the previous mark into ``timings`` (nothing where it is None)."""

    def __init__(self, torch: Any, device: Any, timings: dict[str, float] | None) -> None:
        self.timings = timings
        self.sync = (torch.cuda.synchronize if device.type == "cuda" and timings is not None
                     else (lambda: None))
        self.last = time.perf_counter()

    def __call__(self, stage: str) -> None:
        if self.timings is None:
            return
        self.sync()
        now = time.perf_counter()
        self.timings[stage] = 1e3 * (now - self.last)
        self.last = now


class TrackPipeline:
    """The trained pipeline on one device (``"cpu"``, ``"cuda"``, ``"cuda:1"``).

    ``weights``: ``{name: array}`` (the ``.npz`` the zoo ships): ``net.<module>...`` tensors and
    ``hparam.<name>`` scalars (:data:`DEFAULT_HPARAMS`).
    """

    def __init__(self, weights: Mapping[str, np.ndarray], device: str = "cpu") -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.dtype = torch.float64 if self.device.type == "cpu" else torch.float32
        self.hparams = {name: float(weights.get(f"hparam.{name}", default))
                        for name, default in DEFAULT_HPARAMS.items()}
        nets = build_networks()
        state = {key[len("net."):]: torch.from_numpy(np.array(value))
                 for key, value in weights.items() if key.startswith("net.")}
        if state:
            nets.load_state_dict(state)
        self.nets = nets.to(device=self.device, dtype=self.dtype).eval()

    # -- stages on torch tensors (on self.device) --------------------------------------------------
    def _hits(self, hits: Any) -> Any:
        if isinstance(hits, self.torch.Tensor):  # where it lies (a server's GPU input)
            return hits.reshape(-1, 3).to(device=self.device, dtype=self.torch.float32).to(
                self.dtype)
        array = np.ascontiguousarray(np.asarray(hits, dtype=np.float32).reshape(-1, 3))
        return self.torch.from_numpy(array).to(self.device).to(self.dtype)

    def embed(self, hits: Any) -> Any:
        """``embedding [R, EMBEDDING_DIM]`` float32 of ``hits`` (torch, on the device)."""
        return self.nets["embed"](features(hits)).to(self.torch.float32)

    def graph(self, hits: Any, embedding: Any, counts: np.ndarray) -> Any:
        """Directed edges ``[E, 2]`` (global rows) inside each event, in (source, target) order.

        Events are padded in groups of similar size (sorted by hits); distances are float32
        elementwise sums (no GEMM), so an event's edges never depend on the others."""
        torch = self.torch
        counts = np.asarray(counts, dtype=np.int64)
        starts_np = np.cumsum(counts) - counts
        r = torch.sqrt(hits[:, 0] ** 2 + hits[:, 1] ** 2)
        points = embedding.to(torch.float32)
        radius2 = self.hparams["radius"] ** 2
        found = []
        budget = PAIR_BUDGET if self.device.type == "cpu" else GPU_PAIR_BUDGET
        by_size = np.argsort(counts, kind="stable")
        by_size = by_size[counts[by_size] >= 2]
        for first, stop in pair_chunks(counts[by_size], budget):
            events = by_size[first:stop]
            widest = int(counts[events].max())
            starts = torch.as_tensor(starts_np[events], device=self.device)
            sizes = torch.as_tensor(counts[events], device=self.device)
            column = torch.arange(widest, device=self.device)
            valid = column[None, :] < sizes[:, None]
            index = torch.where(valid, starts[:, None] + column[None, :], 0)
            p, rr = points[index], r[index]
            shape = (len(events), widest, widest)
            distance = torch.zeros(shape, dtype=torch.float32, device=self.device)
            step = torch.empty(shape, dtype=torch.float32, device=self.device)
            for d in range(p.shape[2]):  # elementwise: no GEMM, no dependence on the padding
                torch.sub(p[:, :, None, d], p[:, None, :, d], out=step)
                distance.addcmul_(step, step)
            allowed = (valid[:, :, None] & valid[:, None, :]
                       & (rr[:, None, :] > rr[:, :, None] + MIN_DR) & (distance < radius2))
            distance.masked_fill_(~allowed, math.inf)
            k = min(int(self.hparams["k_max"]), widest)
            nearest, which = torch.topk(distance, k, dim=2, largest=False)
            chosen = torch.zeros_like(allowed).scatter_(2, which, torch.isfinite(nearest))
            event, source, target = torch.nonzero(chosen, as_tuple=True)
            base = starts[event]
            found.append(torch.stack([base + source, base + target], dim=1))
        if not found:
            return torch.zeros((0, 2), dtype=torch.int64, device=self.device)
        edges = torch.cat(found)
        order = torch.argsort(edges[:, 0] * max(len(r), 1) + edges[:, 1])
        return edges[order]

    def filter(self, hits: Any, embedding: Any, edges: Any) -> Any:
        """The edges whose filter score is over ``filter_cut``."""
        if not len(edges):
            return edges
        logits = filter_logits(self.nets, features(hits), embedding.to(self.dtype), edges,
                               edge_features(hits, edges))
        return edges[self.torch.sigmoid(logits) > self.hparams["filter_cut"]]

    def gnn(self, hits: Any, edges: Any) -> Any:
        """The edges whose GNN score is over ``gnn_cut``, the best of each source
        (:func:`best_outgoing`)."""
        if not len(edges):
            return edges
        logits = gnn_scores(self.nets, features(hits), edges, edge_features(hits, edges))
        return best_outgoing(edges, self.torch.sigmoid(logits), self.hparams["gnn_cut"], len(hits))

    def components(self, edges: Any, rows: int, counts: np.ndarray) -> np.ndarray:
        """Track labels ``[rows]`` int64 (numpy) from the kept edges."""
        counts = np.asarray(counts, dtype=np.int64)
        if hasattr(edges, "cpu"):  # kept edges are a forest (best_outgoing): on the device
            labels = forest_labels(edges.to(self.torch.int64), rows, counts,
                                   int(self.hparams["min_hits"]))
            if labels is not None:
                return labels.cpu().numpy()
        kept = edges.cpu().numpy() if hasattr(edges, "cpu") else np.asarray(edges)
        component = forest_roots(kept, rows)
        if component is None:
            component = connected_components(kept, rows)
        return canonical_labels(component, np.asarray(counts, dtype=np.int64),
                                int(self.hparams["min_hits"]))

    # -- whole runs, numpy in and out -------------------------------------------------------------
    def run(self, hits: np.ndarray, counts: np.ndarray | None = None,
            timings: dict[str, float] | None = None) -> np.ndarray:
        """Labels ``[R]`` int64 of ``hits [R, 3]`` float32 (numpy, or a torch tensor on any
        device; ``counts``: rows per event; None: one event). Every stage on the device, one
        copy to the host.

        ``timings``: a dict that receives each stage's milliseconds (the device synchronised at
        each stage's end, so where a call's time goes can be compared between a server's model
        and an in-process run; None: no synchronisation added).
        """
        if not isinstance(hits, self.torch.Tensor):
            hits = np.asarray(hits, dtype=np.float32)
        hits = hits.reshape(-1, 3)
        counts = (np.array([len(hits)], dtype=np.int64) if counts is None
                  else np.asarray(counts, dtype=np.int64).reshape(-1))
        return self._run(hits, counts, timings)

    def _run(self, hits: np.ndarray, counts: np.ndarray, timings: dict[str, float] | None,
             until: str = "cc") -> Any:
        """The stages in order up to ``until``; the labels when that is ``cc``."""
        mark = _StageClock(self.torch, self.device, timings)
        with self.torch.inference_mode():
            rows = self._hits(hits)
            embedding = self.embed(rows)
            mark("embed")
            if until == "embed":
                return None
            edges = self.graph(rows, embedding, counts)
            mark("graph")
            if until == "graph":
                return None
            edges = self.filter(rows, embedding, edges)
            mark("filter")
            if until == "filter":
                return None
            edges = self.gnn(rows, edges)
            mark("gnn")
            if until == "gnn":
                return None
            labels = self.components(edges, len(hits), counts)
            mark("cc")
            return labels

    def run_stage(self, stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One stage on numpy ``inputs`` (per-row arrays, no batch axis; names of
        :data:`STAGE_TENSORS`), numpy outputs: what the ensemble's stage models run when their
        tensors cross the host."""
        torch = self.torch
        tensors = {name: torch.from_numpy(np.ascontiguousarray(np.asarray(value)))
                   for name, value in inputs.items()}
        return {name: value.cpu().numpy() if hasattr(value, "cpu") else value
                for name, value in self.run_stage_tensors(stage, tensors).items()}

    def run_stage_tensors(self, stage: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """One stage on torch ``inputs`` on any device (per-row, no batch axis), outputs as torch
        tensors on this pipeline's device (``labels`` of ``cc``: numpy): a GPU stage model hands
        them to the next stage without a trip through the host.

        >>> pipeline = TrackPipeline({}, "cpu")
        >>> import torch
        >>> out = pipeline.run_stage_tensors("embed", {"hits": torch.ones((5, 3))})
        >>> tuple(out["embedding"].shape), out["embedding"].dtype
        ((5, 8), torch.float32)
        """
        torch = self.torch
        if stage not in STAGE_TENSORS:
            raise ValueError(f"no trackgnn stage {stage!r}; stages: {list(STAGES)}")
        hits_in = inputs["hits"].reshape(-1, 3)
        rows = int(hits_in.shape[0])
        counts_in = inputs.get("hits__counts")
        counts = (np.array([rows], dtype=np.int64) if counts_in is None
                  else counts_in.cpu().numpy().astype(np.int64, copy=False).reshape(-1))

        def tensor(name: str, shape: tuple[int, ...]) -> Any:
            return inputs[name].reshape(shape).to(self.device)

        with torch.inference_mode():
            hits = hits_in.to(device=self.device, dtype=torch.float32).to(self.dtype)
            if stage == "embed":
                return {"embedding": self.embed(hits)}
            if stage == "graph":
                return {"graph_edges": self.graph(hits, tensor("embedding", (-1, EMBEDDING_DIM)),
                                                  counts)}
            if stage == "filter":
                return {"filter_edges": self.filter(hits, tensor("embedding", (-1, EMBEDDING_DIM)),
                                                    tensor("graph_edges", (-1, 2)))}
            if stage == "gnn":
                return {"gnn_edges": self.gnn(hits, tensor("filter_edges", (-1, 2)))}
            return {"labels": self.components(tensor("gnn_edges", (-1, 2)), rows, counts)}

    def warm_up(self, hits: np.ndarray, counts: np.ndarray, parts: int = 3,
                until: str = "cc") -> float:
        """Run the pipeline up to stage ``until`` on the first 1/2**k of the events of a sample
        (k = parts - 1 ... 0) and return the seconds it took (why: docs/internals/zoo.md).

        >>> pipeline = TrackPipeline({}, "cpu")
        >>> rows = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32) * 30
        >>> pipeline.warm_up(rows, np.array([10, 10, 20])) >= 0
        True
        >>> pipeline.warm_up(rows, np.array([10, 10, 20]), until="embed") >= 0  # a stage model's
        True
        """
        if until not in STAGES:
            raise ValueError(f"no trackgnn stage {until!r}; stages: {list(STAGES)}")
        began = time.perf_counter()
        hits = np.asarray(hits, dtype=np.float32).reshape(-1, 3)
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        for k in reversed(range(parts)):
            events = max(1, len(counts) >> k)
            self._run(hits[:bounds[events]], counts[:events], None, until)
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        return time.perf_counter() - began


def load_weights(path: str) -> dict[str, np.ndarray]:
    """The arrays of a weights ``.npz`` file."""
    with np.load(path) as archive:
        return {name: archive[name] for name in archive.files}
