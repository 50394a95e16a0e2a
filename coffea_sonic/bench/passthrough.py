"""``passthrough``: the transport-bound model of the reference bench (x: 16 floats -> y: 2).
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .slice_model import write_slice_model

__all__ = ["PASSTHROUGH", "passthrough_inputs", "write_passthrough"]

PASSTHROUGH = "passthrough"

def write_passthrough(repository: Path, instances: int = 1, max_batch: int = 65536) -> Path:
    """Write the ``passthrough`` model into ``repository`` (created if missing); returns it."""
    return write_slice_model(repository, PASSTHROUGH, ("x", [16]), ("y", [2]),
                             instances=instances, max_batch=max_batch, queue_delay_us=100)


def passthrough_inputs(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``{"x": rows x 16 float32}`` (the answer is ``x[:, :2]``).

    >>> passthrough_inputs(3)["x"].shape
    (3, 16)
    """
    return {"x": np.random.default_rng(seed).random((rows, 16), dtype=np.float32)}
