"""Track labels from the kept edges of the ``trackgnn`` pipeline: connected components and the
per-event numbering of tracks (the pipeline's last stage, ``cc``).

Self-contained like the pipeline: the repository writer copies it into every served trackgnn model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["canonical_labels", "connected_components", "forest_labels", "forest_roots"]


def canonical_labels(component: np.ndarray, counts: np.ndarray, min_hits: int) -> np.ndarray:
    """Per-event track labels from global component ids: components of at least ``min_hits``
    hits numbered 0, 1, ... in each event by their first hit, every other hit -1.

    The labels depend only on each event's own partition, never on the other events of the
    call (components never span events).
    """
    component = np.asarray(component, dtype=np.int64)
    rows = len(component)
    labels = np.full(rows, -1, dtype=np.int64)
    if not rows:
        return labels
    _, first, inverse, size = np.unique(component, return_index=True, return_inverse=True,
                                        return_counts=True)
    tracks = np.flatnonzero(size >= min_hits)  # indices into the unique components
    order = tracks[np.argsort(first[tracks], kind="stable")]
    event_of_row = np.repeat(np.arange(len(counts)), counts)
    event = event_of_row[first[order]]
    rank = np.arange(len(order)) - np.searchsorted(event, event, side="left")
    label_of = np.full(len(first), -1, dtype=np.int64)
    label_of[order] = rank
    labels[:] = label_of[inverse.reshape(-1)]
    return labels


def connected_components(edges: np.ndarray, rows: int) -> np.ndarray:
    """Component id of each of ``rows`` nodes given undirected ``edges [E, 2]`` (scipy when
    present, else min-label propagation with pointer jumping in numpy).

    >>> connected_components(np.array([[0, 2], [3, 4]]), 5).tolist()
    [0, 1, 0, 2, 2]
    """
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    try:
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components as scipy_components
    except Exception:  # noqa: BLE001 - absent, or built for another numpy (a server's numpy < 2)
        label = np.arange(rows, dtype=np.int64)
        source, target = edges[:, 0], edges[:, 1]
        while True:
            low = np.minimum(label[source], label[target])
            before = label.copy()
            np.minimum.at(label, source, low)
            np.minimum.at(label, target, low)
            label = label[label]
            if np.array_equal(label, before):
                break
        return np.unique(label, return_inverse=True)[1].reshape(-1)
    graph = coo_matrix((np.ones(len(edges), dtype=np.int8), (edges[:, 0], edges[:, 1])),
                       shape=(rows, rows))
    return scipy_components(graph, directed=False)[1].astype(np.int64)


def forest_roots(edges: np.ndarray, rows: int, max_steps: int = 64) -> np.ndarray | None:
    """The root of each of ``rows`` nodes when ``edges [E, 2]`` (source, target) give every node
    at most one outgoing edge and form no cycle, as :func:`best_outgoing` leaves them: nodes with
    the same root are one connected component. None when an edge set is not such a forest (then
    use :func:`connected_components`). Pointer jumping: docs/internals/zoo.md.

    >>> forest_roots(np.array([[0, 2], [3, 4], [2, 5]]), 6).tolist()
    [5, 1, 5, 4, 4, 5]
    >>> forest_roots(np.array([[0, 1], [0, 2]]), 3) is None  # two edges out of node 0
    True
    """
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    source, target = edges[:, 0], edges[:, 1]
    if len(source) and np.bincount(source, minlength=rows).max() > 1:
        return None
    parent = np.arange(rows, dtype=np.int64)
    parent[source] = target
    for _ in range(max_steps):
        jumped = parent[parent]
        if np.array_equal(jumped, parent):
            return parent
        parent = jumped
    return None  # a cycle never settles


def forest_labels(edges: Any, rows: int, counts: np.ndarray, min_hits: int) -> Any:
    """:func:`canonical_labels` of the components of a forest of ``edges`` (torch, on their
    device; see :func:`forest_roots`), or None when the edges are not such a forest.

    >>> import torch
    >>> edges = torch.tensor([[0, 1], [1, 2], [4, 5], [5, 6], [7, 8]])
    >>> forest_labels(edges, 9, np.array([4, 5]), min_hits=2).tolist()
    [0, 0, 0, -1, 0, 0, 0, 1, 1]
    >>> canonical_labels(forest_roots(edges.numpy(), 9), np.array([4, 5]), 2).tolist()
    [0, 0, 0, -1, 0, 0, 0, 1, 1]
    """
    import torch

    device = edges.device
    row = torch.arange(rows, device=device)
    if len(edges) and int(torch.bincount(edges[:, 0], minlength=rows).max()) > 1:
        return None
    parent = row.clone()
    parent[edges[:, 0]] = edges[:, 1]
    for _ in range(64):
        jumped = parent[parent]
        if torch.equal(jumped, parent):
            break
        parent = jumped
    else:
        return None  # a cycle never settles
    size = torch.bincount(parent, minlength=rows)
    first = torch.full((rows,), rows, dtype=torch.int64, device=device)
    first = first.scatter_reduce(0, parent, row, reduce="amin")
    first_of_row = first[parent]
    # one row per track: its first row (ascending, so events in order)
    starts = torch.nonzero((first_of_row == row) & (size[parent] >= min_hits)).reshape(-1)
    event_of_row = torch.repeat_interleave(torch.arange(len(counts), device=device),
                                           torch.as_tensor(counts, device=device))
    event = event_of_row[starts].contiguous()
    rank = torch.arange(len(starts), device=device) - torch.searchsorted(event, event)
    label_of_first = torch.full((rows,), -1, dtype=torch.int64, device=device)
    label_of_first[starts] = rank
    return label_of_first[first_of_row]
