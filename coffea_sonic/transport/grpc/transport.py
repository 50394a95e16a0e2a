"""Triton's gRPC API as a :class:`~coffea_sonic.transport.base.Transport`.

Tensors travel in the message (``raw_input_contents``); one HTTP/2 channel per process and
server settings (:mod:`.channel`), made lazily after any fork. This is the wire a remote GPU
server gets, and the one every other transport uses for control calls.

>>> from coffea_sonic.core.endpoint import ServerSettings
>>> GrpcTransport(ServerSettings("127.0.0.1:1"))
GrpcTransport('127.0.0.1:1')
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ...core.endpoint import ServerSettings
from ...core.tensors import ModelInfo
from ...errors import InferenceError
from ...stats import ServerStatistics
from ..base import InferRequest, Transport, TransportFuture, answer_from
from ..errors import TransportError, from_grpc
from ..messages import model_info_from_responses, models_in_index, statistics_from_response
from .channel import Connection, get_connection
from .codec import decode_response, encode_framed

__all__ = ["GrpcTransport"]

logger = logging.getLogger(__name__)


class GrpcTransport(Transport):
    """Requests and control calls to one server over gRPC (see the module docstring)."""

    name = "grpc"

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.address = settings.address
        self._pid = -1
        self._connection: Connection | None = None
        self._metadata: tuple[tuple[str, str], ...] = ()
        self._framed_infer: Any = None

    def __reduce__(self):
        # configuration only: every process makes its own channel
        return (GrpcTransport, (self.settings,))

    @property
    def connection(self) -> Connection:
        """This process' pooled channel and stub (made on first use after any fork)."""
        if self._pid != os.getpid() or self._connection is None:
            self._connection = get_connection(self.address, self.settings.tls,
                                              self.settings.fingerprint)
            self._metadata = self.settings.metadata()
            # ModelInfer taking already serialised requests (see codec.encode_framed)
            from tritonclient.grpc import service_pb2

            self._framed_infer = self._connection.channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=_identity,
                response_deserializer=service_pb2.ModelInferResponse.FromString)
            self._pid = os.getpid()
        return self._connection

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The headers every call carries (revealed secrets: never log)."""
        self.connection
        return self._metadata

    def rpc(self, method: str, request: Any, timeout_s: float) -> Any:
        """Call the unary RPC ``method`` of Triton's service; failures as TransportError."""
        try:
            return getattr(self.connection.stub, method)(request, timeout=timeout_s,
                                                         metadata=self.metadata)
        except TransportError:
            raise
        except Exception as error:  # noqa: BLE001 - grpc.RpcError, unreadable TLS files, ...
            raise from_grpc(error, self.address) from None

    # -- inference ----------------------------------------------------------------------------------

    def submit(self, request: InferRequest) -> TransportFuture:
        """Send ``request``; with ``request.caller_waits`` the call is made and answered in this
        thread (a blocking gRPC call) and the future comes back done. Otherwise gRPC answers in
        its own thread, which it starts anew whenever the channel had no call in flight."""
        future = TransportFuture()
        try:
            self.connection
            payload = encode_framed(request.model, request.version, request.inputs,
                                    request_id=request.request_id, priority=request.priority)
            if request.caller_waits:
                response = self._framed_infer(payload, timeout=request.timeout_s,
                                              metadata=self.metadata)
                self._read(response, future, request)
                return future
            call = self._framed_infer.future(payload, timeout=request.timeout_s,
                                             metadata=self.metadata)
        except Exception as error:  # noqa: BLE001 - reported through the future
            future.fail(from_grpc(error, self.address))
            return future
        future.on_cancel = call.cancel
        call.add_done_callback(lambda done: self._finish(done, future, request))
        return future

    def _finish(self, call: Any, future: TransportFuture, request: InferRequest) -> None:
        if future.done():
            return
        if call.cancelled():
            future.fail(TransportError("cancelled", "request cancelled", address=self.address))
            return
        error = call.exception()
        if error is not None:
            future.fail(from_grpc(error, self.address))
            return
        self._read(call.result(), future, request)

    def _read(self, response: Any, future: TransportFuture, request: InferRequest) -> None:
        """Resolve ``future`` with the answer in ``response`` (or the reason it is unreadable)."""
        try:
            arrays = decode_response(response)
            received = sum(len(raw) for raw in response.raw_output_contents)
            future.resolve(answer_from(request, arrays, version=response.model_version,
                                       nbytes=received))
        except InferenceError as wrong:  # the server's answer is malformed: not retried
            future.fail(wrong)
        except Exception as error:  # noqa: BLE001 - never lose an error in a gRPC thread
            future.fail(InferenceError(f"model {request.model!r} at {self.address}: cannot read "
                                       f"the answer ({type(error).__name__}: {error})"))

    # -- control calls ------------------------------------------------------------------------------

    def ready(self, timeout_s: float) -> bool:
        from tritonclient.grpc import service_pb2

        return bool(self.rpc("ServerReady", service_pb2.ServerReadyRequest(), timeout_s).ready)

    def model_index(self, timeout_s: float) -> dict[str, tuple[str, ...]]:
        from tritonclient.grpc import service_pb2

        return models_in_index(self.rpc("RepositoryIndex",
                                        service_pb2.RepositoryIndexRequest(ready=True), timeout_s))

    def model_ready(self, model: str, version: str, timeout_s: float) -> bool:
        from tritonclient.grpc import service_pb2

        return bool(self.rpc("ModelReady", service_pb2.ModelReadyRequest(
            name=model, version=version), timeout_s).ready)

    def model_info(self, model: str, version: str, timeout_s: float) -> ModelInfo:
        from tritonclient.grpc import service_pb2

        metadata = self.rpc("ModelMetadata", service_pb2.ModelMetadataRequest(
            name=model, version=version), timeout_s)
        config = self.rpc("ModelConfig", service_pb2.ModelConfigRequest(
            name=model, version=version), timeout_s)
        return model_info_from_responses(metadata, config)

    def statistics(self, model: str, version: str, timeout_s: float) -> ServerStatistics:
        from tritonclient.grpc import service_pb2

        response = self.rpc("ModelStatistics", service_pb2.ModelStatisticsRequest(
            name=model, version=version), timeout_s)
        return statistics_from_response(response, model)

    def server_metadata(self, timeout_s: float) -> dict[str, Any]:
        """Server name, version and extensions (for ``coffea-sonic check``)."""
        from tritonclient.grpc import service_pb2

        answer = self.rpc("ServerMetadata", service_pb2.ServerMetadataRequest(), timeout_s)
        return {"name": answer.name, "version": answer.version,
                "extensions": list(answer.extensions)}


def _identity(payload: bytes) -> bytes:
    return payload
