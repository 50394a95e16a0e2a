"""``passthrough``: the transport-bound model of the reference bench (x: 16 floats -> y: 2).

A python-backend model that answers each row's first two values: the server does next to no work
per row, so its rate is set by how fast requests cross the transport (client encoding, the wire or
shared memory, Triton's copies into the python backend, the answer). It is the yardstick on which
TritonModel is compared with NVIDIA's perf_analyzer (:mod:`.reference`).

>>> import tempfile
>>> from pathlib import Path
>>> repo = write_passthrough(Path(tempfile.mkdtemp()))
>>> sorted(p.name for p in (repo / PASSTHROUGH).iterdir())
['1', 'config.pbtxt']
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["PASSTHROUGH", "passthrough_inputs", "write_passthrough"]

PASSTHROUGH = "passthrough"

_CONFIG = """name: "passthrough"
backend: "python"
max_batch_size: %(max_batch)d
input { name: "x" data_type: TYPE_FP32 dims: [16] }
output { name: "y" data_type: TYPE_FP32 dims: [2] }
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group { count: %(instances)d kind: KIND_CPU }
"""

_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = np.ascontiguousarray(x[:, :2])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return responses
'''


def write_passthrough(repository: Path, instances: int = 1, max_batch: int = 65536) -> Path:
    """Write the ``passthrough`` model into ``repository`` (created if missing); returns it."""
    version = repository / PASSTHROUGH / "1"
    version.mkdir(parents=True, exist_ok=True)
    (repository / PASSTHROUGH / "config.pbtxt").write_text(
        _CONFIG % {"instances": instances, "max_batch": max_batch})
    (version / "model.py").write_text(_MODEL)
    return repository


def passthrough_inputs(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``{"x": rows x 16 float32}`` (the answer is ``x[:, :2]``).

    >>> passthrough_inputs(3)["x"].shape
    (3, 16)
    """
    return {"x": np.random.default_rng(seed).random((rows, 16), dtype=np.float32)}
