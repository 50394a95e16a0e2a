"""Transport-bound benchmark models: Triton python-backend models that answer a slice of the input.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

__all__ = ["SINK_NAME", "write_payload_sink", "write_slice_model"]

#: The transport study's sink: ``emtrk_cnn``'s input signature, the first value of a row back.
SINK_NAME = "payload_sink"

_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Transport-bound: the first %(kept)d values of every row, nothing computed."""

    def execute(self, requests):
        responses = []
        for request in requests:
            given = pb_utils.get_input_tensor_by_name(request, "%(input)s").as_numpy()
            kept = np.ascontiguousarray(given.reshape(len(given), -1)[:, :%(kept)d])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("%(output)s", kept)]))
        return responses
'''


def write_slice_model(repository: Path, name: str, input: tuple[str, Sequence[int]],
                      output: tuple[str, Sequence[int]], *, instances: int = 1,
                      max_batch: int = 65536, queue_delay_us: int | None = 100) -> Path:
    """Write model ``name`` (FP32 ``input`` -> its first values as FP32 ``output``, each a
    ``(name, per-row dims)``) into ``repository`` (created if missing); returns it.

    ``queue_delay_us``: the dynamic batcher's delay; None: no dynamic batcher (Triton then
    reports ``max_batch`` as the preferred batch, which coffea's wrapper sends).
    """
    kept = 1
    for dim in output[1]:
        kept *= dim
    version = repository / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    config = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {max_batch}",
              f'input {{ name: "{input[0]}" data_type: TYPE_FP32 dims: {list(input[1])} }}',
              f'output {{ name: "{output[0]}" data_type: TYPE_FP32 dims: {list(output[1])} }}',
              f"instance_group {{ count: {instances} kind: KIND_CPU }}"]
    if queue_delay_us is not None:
        config.append(f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}")
    (repository / name / "config.pbtxt").write_text("\n".join(config) + "\n")
    (version / "model.py").write_text(
        _MODEL % {"input": input[0], "output": output[0], "kept": kept})
    return repository


def write_payload_sink(repository: Path, instances: int = 2) -> Path:
    """Write ``payload_sink`` into ``repository`` (created if missing); returns it. It takes
    ``emtrk_cnn``'s input (``patch`` FP32 [1, 48, 48] per row, 9 216 bytes) and answers
    ``first`` = ``patch[:, 0, 0, 0]``: a request costs almost nothing to compute.

    >>> import tempfile
    >>> repo = write_payload_sink(Path(tempfile.mkdtemp()))
    >>> sorted(p.name for p in (repo / SINK_NAME).iterdir())
    ['1', 'config.pbtxt']
    """
    return write_slice_model(repository, SINK_NAME, ("patch", [1, 48, 48]), ("first", [1]),
                             instances=instances, max_batch=65536, queue_delay_us=0)
