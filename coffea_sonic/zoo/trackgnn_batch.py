"""Several requests of one trackgnn stage run as one pass, and the answers split back per request.

Self-contained: the repository writer copies it beside the pipeline. How it works:
docs/internals/zoo.md, "Batched stage requests".

>>> import torch
>>> batch = [{"hits": torch.zeros((2, 3)), "gnn_edges": torch.tensor([[0, 1]])},
...          {"hits": torch.zeros((3, 3)), "gnn_edges": torch.tensor([[1, 2]])}]
>>> joined, rows = join_stage_inputs(batch, "cpu")
>>> joined["gnn_edges"].tolist(), joined["hits__counts"].tolist(), rows
([[0, 1], [3, 4]], [2, 3], [2, 3])
>>> [part["gnn_edges"].tolist() for part in split_stage_outputs({"gnn_edges": joined["gnn_edges"]}, rows)]
[[[0, 1]], [[1, 2]]]
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

#: The input that holds the rows of each event; a request without it is one event.
COUNTS = "hits__counts"


def _is_edges(name: str) -> bool:
    return name.endswith("_edges")


def _tensor(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    return torch.from_numpy(np.ascontiguousarray(np.asarray(value)))


def join_stage_inputs(batch: Sequence[Mapping[str, Any]],
                      device: Any) -> tuple[dict[str, Any], list[int]]:
    """The requests' inputs (numpy or torch, per row, no batch axis) as one request on
    ``device``, and the rows of each request. Every request becomes whole events of the joined
    one: its counts (or its rows as one event), its edges shifted by the rows before it."""
    import torch

    rows = [int(_tensor(inputs["hits"]).reshape(-1, 3).shape[0]) for inputs in batch]
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64).tolist()
    joined: dict[str, Any] = {}
    for name in batch[0]:
        if name == COUNTS:
            continue
        parts = []
        for inputs, start in zip(batch, starts):
            value = _tensor(inputs[name]).to(device)
            if _is_edges(name):
                parts.append(value.reshape(-1, 2) + start)
            else:
                parts.append(value.reshape(-1, value.shape[-1]))
        joined[name] = torch.cat(parts)
    counts = [_tensor(inputs[COUNTS]).cpu().numpy().reshape(-1).astype(np.int64)
              if inputs.get(COUNTS) is not None else np.array([n], dtype=np.int64)
              for inputs, n in zip(batch, rows)]
    joined[COUNTS] = torch.from_numpy(np.concatenate(counts))
    return joined, rows


def split_stage_outputs(outputs: Mapping[str, Any], rows: Sequence[int]) -> list[dict[str, Any]]:
    """A joined run's outputs split back into each request's: per-row outputs (torch or numpy) by
    rows, edges (sorted by source) by their source row, shifted back to the request's rows."""
    import torch

    starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    parts: list[dict[str, Any]] = [{} for _ in rows]
    for name, value in outputs.items():
        if _is_edges(name):
            sources = value[:, 0].contiguous()
            bounds = torch.searchsorted(
                sources, torch.as_tensor(starts, device=sources.device)).tolist()
            for index, part in enumerate(parts):
                part[name] = value[bounds[index]:bounds[index + 1]] - int(starts[index])
        else:
            for index, part in enumerate(parts):
                part[name] = value[int(starts[index]):int(starts[index + 1])]
    return parts


def run_stage_batch(pipeline: Any, stage: str,
                    batch: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``pipeline.run_stage_tensors(stage, inputs)`` for every request of ``batch`` in one pass:
    the outputs of each request, as a run of that request alone gives them (torch tensors on the
    pipeline's device; ``labels``: numpy)."""
    if len(batch) == 1:
        return [pipeline.run_stage_tensors(stage, {name: _tensor(value)
                                                   for name, value in batch[0].items()})]
    joined, rows = join_stage_inputs(batch, pipeline.device)
    return split_stage_outputs(pipeline.run_stage_tensors(stage, joined), rows)
