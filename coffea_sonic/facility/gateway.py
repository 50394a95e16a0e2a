"""A tiny bearer-token gRPC gateway in front of a Triton server, for tests and demos on loopback.

Why, what it is not, and an example: docs/internals/gateway.md.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
from concurrent import futures
from typing import Any, Callable, Iterator

import grpc

from ..errors import ConfigurationError

logger = logging.getLogger(__name__)

__all__ = ["TokenGateway"]

_MESSAGE_LIMITS = [("grpc.max_send_message_length", 2**31 - 1),
                   ("grpc.max_receive_message_length", 2**31 - 1)]
# metadata gRPC manages itself; forwarding it would confuse the upstream call
_NOT_FORWARDED = ("authorization", "user-agent")


def _forwarded_metadata(metadata: Any) -> list[tuple[str, Any]]:
    return [(key, value) for key, value in (metadata or ())
            if key not in _NOT_FORWARDED and not key.startswith((":", "grpc-"))]


class _Forwarder(grpc.GenericRpcHandler):
    def __init__(self, gateway: "TokenGateway") -> None:
        self.gateway = gateway

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        if not self.gateway._authorized(details.invocation_metadata):
            self.gateway._count("rejected")
            return grpc.unary_unary_rpc_method_handler(self._reject)
        self.gateway._count("accepted")
        if method.endswith("/ModelStreamInfer"):
            return grpc.stream_stream_rpc_method_handler(self._stream(method))
        return grpc.unary_unary_rpc_method_handler(self._unary(method))

    @staticmethod
    def _reject(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      "missing or invalid bearer token (send 'authorization: Bearer <token>')")

    def _unary(self, method: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        call = self.gateway._channel.unary_unary(method)

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                return call(request, metadata=_forwarded_metadata(context.invocation_metadata()),
                            timeout=context.time_remaining())
            except grpc.RpcError as error:
                context.abort(error.code(), error.details() or "")
        return forward

    def _stream(self, method: str) -> Callable[[Iterator[bytes], grpc.ServicerContext], Iterator[bytes]]:
        call = self.gateway._channel.stream_stream(method)

        def forward(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            try:
                yield from call(requests, metadata=_forwarded_metadata(context.invocation_metadata()))
            except grpc.RpcError as error:
                context.abort(error.code(), error.details() or "")
        return forward


class TokenGateway:
    """Forward gRPC calls to ``upstream`` only when they carry the expected bearer token.

    The expected token is read from the variable ``token_env`` at start (it is never logged).
    ``address`` is ``host:port`` once started (port 0 = pick a free one); ``accepted`` and
    ``rejected`` count calls. Use as a context manager.
    """

    def __init__(self, upstream: str, *, token_env: str, host: str = "127.0.0.1", port: int = 0,
                 max_workers: int = 16) -> None:
        self.upstream = upstream
        self.token_env = token_env
        self.host = host
        self.port = port
        self.max_workers = max_workers
        self.accepted = 0
        self.rejected = 0
        self._expected: bytes | None = None
        self._server: grpc.Server | None = None
        self._channel: grpc.Channel | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = self.address if self._server is not None else "stopped"
        return f"TokenGateway(upstream={self.upstream!r}, token=${self.token_env}, {state})"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def url(self, model: str) -> str:
        """``triton+grpc://`` URL of ``model`` through this gateway."""
        return f"triton+grpc://{self.address}/{model}"

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def _authorized(self, metadata: Any) -> bool:
        sent = dict(metadata or ()).get("authorization", "")
        if isinstance(sent, bytes):
            sent = sent.decode(errors="replace")
        return hmac.compare_digest(sent.encode(), self._expected or b"\0")

    def start(self) -> "TokenGateway":
        token = os.environ.get(self.token_env, "").strip()
        if not token:
            raise ConfigurationError(f"TokenGateway needs the token in ${self.token_env}; it is empty")
        self._expected = (token if token.lower().startswith("bearer ") else f"Bearer {token}").encode()
        self._channel = grpc.insecure_channel(self.upstream, options=_MESSAGE_LIMITS)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.max_workers),
                                   options=_MESSAGE_LIMITS)
        self._server.add_generic_rpc_handlers((_Forwarder(self),))
        self.port = self._server.add_insecure_port(f"{self.host}:{self.port}")
        self._server.start()
        logger.info("token gateway %s -> %s", self.address, self.upstream)
        return self

    def stop(self) -> None:
        """Stop serving and close the upstream channel. Idempotent."""
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self) -> "TokenGateway":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
