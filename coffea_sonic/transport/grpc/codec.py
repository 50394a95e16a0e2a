"""numpy arrays <-> Triton gRPC messages (docs/internals/transport.md, Encoding)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ...core.tensors import TensorInfo, decode_tensor, tensor_bytes, triton_dtype
from ...errors import InferenceError

__all__ = ["decode_response", "encode_framed", "encode_request", "request_outputs"]


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
        request.raw_input_contents.append(bytes(tensor_bytes(array)))
    return request


def decode_response(response) -> dict[str, np.ndarray]:
    """``{output name: array}`` of a ``ModelInferResponse`` (read-only views into its bytes)."""
    raw = response.raw_output_contents
    if len(raw) != len(response.outputs):
        raise InferenceError(
            f"response of model {response.model_name!r} has {len(response.outputs)} outputs but "
            f"{len(raw)} raw contents; the server must send raw output contents")
    what = f"model {response.model_name!r} "
    return {tensor.name: decode_tensor(tensor.name, tensor.datatype, tensor.shape, content, what)
            for tensor, content in zip(response.outputs, raw)}


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
        data = memoryview(tensor_bytes(array))
        parts += [_RAW_INPUT_TAG, _varint(data.nbytes), data]
    return b"".join([header.SerializeToString(), *parts])
