"""What a model declares: tensors and signatures (docs/internals/core.md)."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import InferenceError

__all__ = ["ModelInfo", "NamedTensors", "TensorInfo", "decode_tensor", "numpy_dtype",
           "signature_checksum", "tensor_bytes", "triton_dtype"]

_TRITON_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(bool), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
try:  # numpy has no bfloat16; tritonclient takes ml_dtypes' (its own dependency)
    import ml_dtypes

    _TRITON_TO_NUMPY["BF16"] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - an older tritonclient without ml_dtypes
    pass
_NUMPY_TO_TRITON: dict[np.dtype, str] = {value: key for key, value in _TRITON_TO_NUMPY.items()}


def numpy_dtype(datatype: str) -> np.dtype:
    """numpy dtype of Triton datatype ``datatype`` (``"FP32"``; config's ``TYPE_FP32`` also works)."""
    name = datatype[5:] if datatype.startswith("TYPE_") else datatype
    if name == "STRING":
        name = "BYTES"
    try:
        return _TRITON_TO_NUMPY[name]
    except KeyError:
        raise InferenceError(f"Triton datatype {datatype!r} has no numpy equivalent "
                             "(BF16 needs the ml_dtypes package)") from None


def triton_dtype(dtype: np.dtype) -> str:
    """Triton datatype name of numpy ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype.kind in "SU":
        return "BYTES"
    return _NUMPY_TO_TRITON[dtype]


def tensor_bytes(array: np.ndarray) -> Any:
    """The bytes Triton expects for ``array``: BYTES serialised, else a flat view of its memory.

    >>> bytes(tensor_bytes(np.array([[1, 2]], np.uint8))), tensor_bytes(np.array([b"ab"], object))
    (b'\\x01\\x02', b'\\x02\\x00\\x00\\x00ab')
    """
    if array.dtype == object or array.dtype.kind in "SU":
        from tritonclient.utils import serialize_byte_tensor

        serialized = serialize_byte_tensor(array)
        return serialized.item() if serialized.size else b""
    # a flat byte view (memoryview.cast refuses shapes with a 0, e.g. [1, 0, 3])
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def decode_tensor(name: str, datatype: str, shape: Sequence[int], content: Any,
                  what: str = "") -> np.ndarray:
    """Tensor ``name`` from the bytes Triton sent (a read-only view of ``content``); an
    ``InferenceError`` (its message led by ``what``) when they do not fit the shape.

    >>> decode_tensor("y", "FP32", [2], np.ones(2, np.float32).tobytes())
    array([1., 1.], dtype=float32)
    """
    dtype, shape = numpy_dtype(datatype), tuple(shape)
    if dtype == object:
        from tritonclient.utils import deserialize_bytes_tensor

        return deserialize_bytes_tensor(bytes(content)).reshape(shape)
    expected = math.prod(shape) * dtype.itemsize
    if len(content) != expected:
        raise InferenceError(f"{what}output {name!r}: {len(content)} bytes for shape "
                             f"{list(shape)} {datatype} (expected {expected})")
    return np.frombuffer(content, dtype=dtype).reshape(shape)


@dataclass(frozen=True)
class TensorInfo:
    """One declared tensor: name, Triton datatype (``"FP32"``), per-row dims (``-1`` = variable).

    >>> TensorInfo("x", "FP32", (-1, 3)).describe()
    'x FP32[-1, 3]'
    """

    name: str
    datatype: str
    dims: tuple[int, ...]
    #: K > 0: asked as Triton's classification extension (the top K classes as BYTES
    #: ``"score:index[:label]"``, see :mod:`coffea_sonic.classification`)
    classification: int = field(default=0, repr=False)
    #: an output whose config names a ``label_filename`` (what classification answers with)
    labelled: bool = field(default=False, repr=False, compare=False)

    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.datatype)

    def describe(self) -> str:
        top = f" (top {self.classification} classes)" if self.classification else ""
        return f"{self.name} {self.datatype}{list(self.dims)}{top}"


class NamedTensors:
    """``input_names`` and ``output_names`` of anything with ``inputs`` and ``outputs`` whose items
    have a ``name`` (a served model's :class:`ModelInfo`, a zoo model's declaration).

    >>> ModelInfo("m", ("1",), "onnxruntime", 8, (TensorInfo("x", "FP32", (4,)),),
    ...           (TensorInfo("y", "FP32", (1,)),)).output_names
    ('y',)
    """

    inputs: tuple
    outputs: tuple

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)


@dataclass(frozen=True)
class ModelInfo(NamedTensors):
    """The served signature of one model (one version, or the latest when ``version`` is ``""``)."""

    name: str
    versions: tuple[str, ...]
    platform: str
    max_batch_size: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    checksum: str = field(default="")
    #: inputs the config marks ``allow_ragged_batch: true`` (see :mod:`coffea_sonic.ragged`)
    ragged_inputs: tuple[str, ...] = ()
    #: outputs shaped like a ragged input (config ``batch_output`` of kind
    #: ``BATCH_SCATTER_WITH_INPUT_SHAPE``): one row per object, not per event
    ragged_outputs: tuple[str, ...] = ()
    #: the GPUs (the server's numbering) its ``KIND_GPU`` instance groups run on; empty: CPU
    gpus: tuple[int, ...] = ()
    #: the config enables Triton's response cache (``response_cache { enable: true }``)
    response_cache: bool = False

    def __post_init__(self) -> None:
        if not self.checksum:
            object.__setattr__(self, "checksum", signature_checksum(
                self.platform, self.max_batch_size, self.inputs, self.outputs,
                self.ragged_inputs, self.ragged_outputs))

    @property
    def gpu(self) -> bool:
        """Whether the server runs this model on a GPU."""
        return bool(self.gpus)

    @property
    def on_gpu_zero(self) -> bool:
        """Whether CUDA shared memory may carry this model's tensors: every GPU instance on the
        server's GPU 0, and no response cache (why: docs/internals/core.md).

        >>> x = (TensorInfo("x", "FP32", (2,)),)
        >>> ModelInfo("m", ("1",), "onnx", 8, x, x, gpus=(0,)).on_gpu_zero
        True
        >>> ModelInfo("m", ("1",), "onnx", 8, x, x, gpus=(0,), response_cache=True).on_gpu_zero
        False
        """
        return set(self.gpus) == {0} and not self.response_cache

    @property
    def batching(self) -> bool:
        """True if the model takes a leading batch dimension (``max_batch_size > 0``)."""
        return self.max_batch_size > 0

    @property
    def latest_version(self) -> str:
        numeric = [v for v in self.versions if v.isdigit()]
        return max(numeric, key=int) if numeric else ""

    def describe(self) -> str:
        """One line: ``name: inputs -> outputs (max_batch_size N)``."""
        ins = ", ".join(t.describe() for t in self.inputs)
        outs = ", ".join(t.describe() for t in self.outputs)
        return f"{self.name}: {ins} -> {outs} (max_batch_size {self.max_batch_size})"


def signature_checksum(platform: str, max_batch_size: int, inputs: Sequence[TensorInfo],
                       outputs: Sequence[TensorInfo], ragged_inputs: Sequence[str] = (),
                       ragged_outputs: Sequence[str] = (), answering: str = "") -> str:
    """16 hex digits over what a client relies on (not instance counts or devices).

    ``answering``: a digest of the served config's parts that change the answers (see
    :func:`coffea_sonic.transport.messages.answering_digest`); counts only when present.

    >>> len(signature_checksum("python", 8, [TensorInfo("x", "FP32", (4,))], []))
    16
    """
    signature = {
        "platform": platform, "max_batch_size": max_batch_size,
        "inputs": [[t.name, t.datatype, list(t.dims)] for t in inputs],
        "outputs": [[t.name, t.datatype, list(t.dims)] for t in outputs],
    }
    if ragged_inputs or ragged_outputs:
        signature["ragged"] = [sorted(ragged_inputs), sorted(ragged_outputs)]
    if answering:
        signature["answering"] = answering
    canonical = json.dumps(signature, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
