"""``payload_sink``: a transport-only benchmark model for Triton's python backend.

It takes the input signature of ``emtrk_cnn`` (``patch`` FP32 [1, 48, 48] per row, 9 216 bytes) and
answers one float per row (the row's first value), so a request costs almost nothing to compute
and its time is the transport's (:mod:`coffea_sonic.bench.slice_model`). The output proves the
bytes arrived (it equals ``patch[:, 0, 0, 0]``).

>>> import tempfile
>>> from pathlib import Path
>>> repo = write_sink(Path(tempfile.mkdtemp()))
>>> sorted(p.name for p in (repo / "payload_sink").iterdir())
['1', 'config.pbtxt']
"""

from __future__ import annotations

from pathlib import Path

from coffea_sonic.bench.slice_model import write_slice_model

SINK_NAME = "payload_sink"


def write_sink(repository: Path, instances: int = 2) -> Path:
    """Write the ``payload_sink`` model into ``repository`` (created if missing); returns it."""
    return write_slice_model(repository, SINK_NAME, ("patch", [1, 48, 48]), ("first", [1]),
                             instances=instances, max_batch=65536, queue_delay_us=0)
