"""``payload_sink``: a transport-only benchmark model for Triton's python backend.

It takes the input signature of ``emtrk_cnn`` (``patch`` FP32 [1, 48, 48] per row, 9 216 bytes) and
answers one float per row (the row's first value), so a request costs almost nothing to compute
and its time is the transport's: client encoding, the wire or shared memory, Triton's copies into
the python backend, and the answer. The output proves the bytes arrived (it equals
``patch[:, 0, 0, 0]``).

>>> import tempfile
>>> from pathlib import Path
>>> repo = write_sink(Path(tempfile.mkdtemp()))
>>> sorted(p.name for p in (repo / "payload_sink").iterdir())
['1', 'config.pbtxt']
"""

from __future__ import annotations

from pathlib import Path

SINK_NAME = "payload_sink"

SINK_CONFIG = """name: "payload_sink"
backend: "python"
max_batch_size: 65536
input { name: "patch" data_type: TYPE_FP32 dims: [1, 48, 48] }
output { name: "first" data_type: TYPE_FP32 dims: [1] }
dynamic_batching { max_queue_delay_microseconds: 0 }
instance_group { count: %(instances)d kind: KIND_CPU }
"""

SINK_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            patch = pb_utils.get_input_tensor_by_name(request, "patch").as_numpy()
            first = np.ascontiguousarray(patch.reshape(len(patch), -1)[:, :1])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("first", first)]))
        return responses
'''


def write_sink(repository: Path, instances: int = 2) -> Path:
    """Write the ``payload_sink`` model into ``repository`` (created if missing); returns it."""
    version = repository / SINK_NAME / "1"
    version.mkdir(parents=True, exist_ok=True)
    (repository / SINK_NAME / "config.pbtxt").write_text(SINK_CONFIG % {"instances": instances})
    (version / "model.py").write_text(SINK_MODEL)
    return repository
