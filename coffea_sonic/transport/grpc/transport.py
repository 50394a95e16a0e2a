"""Triton's gRPC API as a Transport (how: docs/internals/transport.md)."""

from __future__ import annotations

import time

import itertools
import logging
import os
import threading
from typing import Any

from ...core.endpoint import ServerSettings
from ...core.tensors import ModelInfo
from ...errors import ConfigurationError, InferenceError
from ...stats import ServerStatistics
from ..base import InferRequest, Transport, TransportFuture, answer_from
from ..errors import TransportError, from_grpc
from ..messages import model_info_from_responses, models_in_index, statistics_from_response
from ..compression import configured_compression
from ..kinds import transport_kind
from .channel import RECONNECT_WAIT_S, Connection, get_connection
from .codec import decode_response, encode_framed
from .heap import tune_heap
from ..senders import send_soon

__all__ = ["GrpcTransport"]

logger = logging.getLogger(__name__)

#: How often a refused control call on a used channel asks again while it waits for the
#: channel's next try (see GrpcTransport.rpc).
RECONNECT_POLL_S = 0.1


class GrpcTransport(Transport):
    """Requests and control calls to one server over gRPC (docs/internals/transport.md)."""

    name = "grpc"

    def __init__(self, settings: ServerSettings, connections: int | None = None,
                 compression: str | None = None) -> None:
        self.settings = settings
        self.address = settings.address
        #: HTTP/2 connections requests are spread over (round robin, each made on first use)
        self.connections = connections or default_connections()
        #: how inference requests are compressed: "none", "gzip" or "deflate" (the server
        #: decompresses; its answers come back as it sends them)
        self.compression = configured_compression(compression)
        self._pid = -1
        self._connection: Connection | None = None
        self._metadata: tuple[tuple[str, str], ...] = ()
        self._framed_infers: list[Any] = []
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def __reduce__(self):
        # configuration only: every process makes its own channel
        return (GrpcTransport, (self.settings, self.connections, self.compression))

    @property
    def connection(self) -> Connection:
        """This process' pooled channel and stub (made on first use after any fork)."""
        if self._pid != os.getpid() or self._connection is None:
            tune_heap()
            self._connection = get_connection(self.address, self.settings.tls,
                                              self.settings.fingerprint)
            self._metadata = self.settings.metadata()
            self._framed_infers = [_framed_infer(self._connection)] + [None] * (
                self.connections - 1)
            self._pid = os.getpid()
        return self._connection

    def _next_infer(self) -> Any:
        """ModelInfer on the next connection in turn (made on first use)."""
        index = next(self._turn) % self.connections
        infer = self._framed_infers[index]
        if infer is None:
            with self._lock:
                infer = self._framed_infers[index]
                if infer is None:
                    infer = self._framed_infers[index] = _framed_infer(get_connection(
                        self.address, self.settings.tls, self.settings.fingerprint, index))
        return infer

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The headers every call carries (revealed secrets: never log)."""
        self.connection
        return self._metadata

    def rpc(self, method: str, request: Any, timeout_s: float) -> Any:
        """Call the unary RPC ``method`` of Triton's service; failures as TransportError.

        A refusal on a channel used before may be its memory of an earlier server on this address:
        such a call is asked again every 0.1 s for up to channel.RECONNECT_WAIT_S (the channel's
        next try), and the refusal raised if none is answered. Each ask fails at once while the
        channel is down, so no call waits in flight (a fork then would hang the child)."""
        connection = self.connection
        reused, connection.used = connection.used, True
        try:
            return self._rpc(connection, method, request, timeout_s)
        except TransportError as error:
            if error.kind != "down" or not reused:
                raise
            refused = error
        deadline = time.monotonic() + min(timeout_s, RECONNECT_WAIT_S)
        while time.monotonic() + RECONNECT_POLL_S < deadline:
            time.sleep(RECONNECT_POLL_S)
            try:
                return self._rpc(connection, method, request, deadline - time.monotonic())
            except TransportError as error:
                if error.kind not in ("down", "timeout"):
                    raise
        raise refused

    def _rpc(self, connection: Connection, method: str, request: Any, timeout_s: float) -> Any:
        try:
            return getattr(connection.stub, method)(request, timeout=timeout_s,
                                                    metadata=self.metadata)
        except Exception as error:  # noqa: BLE001 - grpc.RpcError, unreadable TLS files, ...
            raise from_grpc(error, self.address) from None

    # -- inference ----------------------------------------------------------------------------------

    def submit(self, request: InferRequest) -> TransportFuture:
        """Send ``request``: in this thread with ``request.caller_waits`` (the future comes back
        done), else on a sender thread (why: docs/internals/transport.md, "Sending")."""
        future = TransportFuture()
        try:
            self.connection.used = True  # a later control refusal may be its memory
            payload = encode_framed(request.model, request.version, request.inputs,
                                    request_id=request.request_id, priority=request.priority,
                                    outputs=request.outputs)
        except Exception as error:  # noqa: BLE001 - reported through the future
            future.fail(from_grpc(error, self.address))
            return future
        if request.caller_waits:
            self._blocking(payload, future, request)
            return future
        send_soon(self._blocking, payload, future, request)
        # let the sender thread take the GIL now and put this request on the wire while this
        # thread encodes the call's next one: without it, it waits for the interpreter's switch
        # interval (5 ms), and a lone caller's link idles that long at the start of every call
        time.sleep(0)
        return future

    def _blocking(self, payload: bytes, future: TransportFuture, request: InferRequest) -> None:
        if future.done():  # cancelled while queued
            return
        try:
            response = self._next_infer()(payload, timeout=request.timeout_s,
                                          metadata=self.metadata + request.headers,
                                          compression=_grpc_compression(self.compression))
        except Exception as error:  # noqa: BLE001 - reported through the future
            future.fail(from_grpc(error, self.address))
            return
        self._read(response, future, request)

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

    def call(self, method: str, timeout_s: float, **fields: Any) -> Any:
        """:meth:`rpc` ``method`` with its ``<method>Request`` of ``fields``.

        >>> try:
        ...     GrpcTransport(ServerSettings("127.0.0.1:1")).call("ServerReady", 0.5)
        ... except TransportError as nobody_there:
        ...     nobody_there.kind
        'down'
        """
        from tritonclient.grpc import service_pb2

        return self.rpc(method, getattr(service_pb2, f"{method}Request")(**fields), timeout_s)

    def ready(self, timeout_s: float) -> bool:
        return bool(self.call("ServerReady", timeout_s).ready)

    def model_index(self, timeout_s: float) -> dict[str, tuple[str, ...]]:
        return models_in_index(self.call("RepositoryIndex", timeout_s, ready=True))

    def model_ready(self, model: str, version: str, timeout_s: float) -> bool:
        return bool(self.call("ModelReady", timeout_s, name=model, version=version).ready)

    def model_info(self, model: str, version: str, timeout_s: float) -> ModelInfo:
        metadata = self.call("ModelMetadata", timeout_s, name=model, version=version)
        config = self.call("ModelConfig", timeout_s, name=model, version=version)
        return model_info_from_responses(metadata, config)

    def statistics(self, model: str, version: str, timeout_s: float) -> ServerStatistics:
        response = self.call("ModelStatistics", timeout_s, name=model, version=version)
        return statistics_from_response(response, model)

    def server_metadata(self, timeout_s: float) -> dict[str, Any]:
        """Server name, version and extensions (for ``coffea-sonic check``)."""
        answer = self.call("ServerMetadata", timeout_s)
        return {"name": answer.name, "version": answer.version,
                "extensions": list(answer.extensions)}





def _grpc_compression(name: str) -> Any:
    """gRPC's enum member for a compression name."""
    import grpc

    return {"none": grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip,
            "deflate": grpc.Compression.Deflate}[name]

#: gRPC connections per server and process (a bound: each is a socket on the server too)
MAX_CONNECTIONS = 8
DEFAULT_CONNECTIONS = transport_kind("grpc").connections

def _framed_infer(connection: Connection) -> Any:
    """ModelInfer on ``connection``, taking already serialised requests (codec.encode_framed)."""
    from tritonclient.grpc import service_pb2

    return connection.channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer", request_serializer=None,
        response_deserializer=service_pb2.ModelInferResponse.FromString)


def default_connections() -> int:
    """Connections per server and process: ``$COFFEA_SONIC_GRPC_CONNECTIONS``, else
    :data:`DEFAULT_CONNECTIONS`.

    >>> 1 <= default_connections() <= MAX_CONNECTIONS
    True
    """
    text = os.environ.get("COFFEA_SONIC_GRPC_CONNECTIONS", "")
    try:
        count = int(text) if text else DEFAULT_CONNECTIONS
    except ValueError:
        raise ConfigurationError(
            f"COFFEA_SONIC_GRPC_CONNECTIONS must be a whole number, not {text!r}") from None
    if not 1 <= count <= MAX_CONNECTIONS:
        raise ConfigurationError(f"COFFEA_SONIC_GRPC_CONNECTIONS must be 1 to {MAX_CONNECTIONS}, "
                                 f"not {count}")
    return count
