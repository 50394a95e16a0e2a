"""numpy arrays <-> Triton gRPC messages (docs/internals/transport.md, Encoding)."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ...core.tensors import TensorInfo, numpy_dtype, triton_dtype
from ...errors import InferenceError

__all__ = ["decode_response", "encode_framed", "encode_request", "raw_bytes", "request_outputs"]

def raw_bytes(array: np.ndarray) -> bytes:
    if array.dtype == object or array.dtype.kind in "SU":
        from tritonclient.utils import serialize_byte_tensor

        serialized = serialize_byte_tensor(array)
        return serialized.item() if serialized.size else b""
    return np.ascontiguousarray(array).tobytes()


def encode_request(model: str, version: str, inputs: Mapping[str, np.ndarray],
                   request_id: str = ""):
    """A ``ModelInferRequest`` carrying ``inputs`` (all outputs are returned by the server)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, array in inputs.items():
        tensor = request.inputs.add()
        tensor.name = name
        tensor.datatype = triton_dtype(array.dtype)
        tensor.shape.extend(array.shape)
        request.raw_input_contents.append(raw_bytes(array))
    return request


def decode_response(response) -> dict[str, np.ndarray]:
    """``{output name: array}`` of a ``ModelInferResponse`` (read-only views into its bytes)."""
    raw = response.raw_output_contents
    if len(raw) != len(response.outputs):
        raise InferenceError(
            f"response of model {response.model_name!r} has {len(response.outputs)} outputs but "
            f"{len(raw)} raw contents; the server must send raw output contents")
    outputs: dict[str, np.ndarray] = {}
    for tensor, content in zip(response.outputs, raw):
        shape = tuple(tensor.shape)
        dtype = numpy_dtype(tensor.datatype)
        if dtype == object:
            from tritonclient.utils import deserialize_bytes_tensor

            outputs[tensor.name] = deserialize_bytes_tensor(content).reshape(shape)
            continue
        expected = math.prod(shape) * dtype.itemsize
        if len(content) != expected:
            raise InferenceError(
                f"model {response.model_name!r} output {tensor.name!r}: {len(content)} bytes for "
                f"shape {list(shape)} {tensor.datatype} (expected {expected})")
        outputs[tensor.name] = np.frombuffer(content, dtype=dtype).reshape(shape)
    return outputs


def request_outputs(message, outputs: Sequence[TensorInfo]) -> None:
    """Name every output in ``message`` with its classification count, when any is classified."""
    if not any(output.classification for output in outputs):
        return
    for output in outputs:
        tensor = message.outputs.add(name=output.name)
        if output.classification:
            tensor.parameters["classification"].int64_param = output.classification


#: ``raw_input_contents`` is field 7 of ``ModelInferRequest``, length-delimited: tag (7 << 3) | 2
_RAW_INPUT_TAG = b"\x3a"


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def encode_framed(model: str, version: str, inputs: Mapping[str, np.ndarray],
                  request_id: str = "", priority: int = 0,
                  outputs: Sequence[TensorInfo] = ()) -> bytes:
    """The serialised ``ModelInferRequest`` of :func:`encode_request`, with one copy of the tensors
    (how: docs/internals/transport.md, "Encoding"); ``priority`` > 0 sets the request parameter.

    >>> from tritonclient.grpc import service_pb2
    >>> service_pb2.ModelInferRequest.FromString(encode_framed("m", "", {}, priority=3)
    ...                                          ).parameters["priority"].uint64_param
    3
    """
    from tritonclient.grpc import service_pb2

    header = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    if priority:
        header.parameters["priority"].uint64_param = priority
    request_outputs(header, outputs)
    parts: list = []
    for name, array in inputs.items():
        tensor = header.inputs.add()
        tensor.name = name
        tensor.datatype = triton_dtype(array.dtype)
        tensor.shape.extend(array.shape)
        if array.dtype == object or array.dtype.kind in "SU":
            data = memoryview(raw_bytes(array))
        else:
            # a flat byte view (memoryview.cast refuses shapes with a 0, e.g. [1, 0, 3])
            data = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        parts += [_RAW_INPUT_TAG, _varint(data.nbytes), data]
    return b"".join([header.SerializeToString(), *parts])
