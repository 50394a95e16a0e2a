"""Triton's HTTP/REST API (binary tensors) as a Transport (docs/internals/transport.md)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, Sequence
from urllib.parse import quote

from ...core.endpoint import DEFAULT_HTTP_PORT, ServerSettings, parse_address
from ...core.tensors import ModelInfo
from ...errors import ConfigurationError, InferenceError
from ...stats import ServerStatistics
from ..base import InferAnswer, InferRequest, Transport, TransportFuture, answer_from
from ..compression import configured_compression
from ..errors import TransportError, from_http_status
from ..messages import model_info_from_responses, models_in_index, statistics_from_response
from .wire import (Connection, ProtocolError, Response, compress, decode_outputs, decompress,
                   encode_inputs, error_message, ssl_context)

__all__ = ["Compression", "HttpTransport"]

Compression = Literal["gzip", "deflate"]
_STALE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_PORT_HINT = ("; is the server running, and is this its HTTP port (Triton's default 8000), "
              "not the gRPC one?")


@dataclasses.dataclass(slots=True)
class _Call:
    """One request in flight through :meth:`HttpTransport.submit`: its future and connection."""

    future: TransportFuture
    connection: Connection | None = None

    def abort(self) -> None:  # the future's cancel hook: fail the socket calls in progress
        connection = self.connection
        if connection is not None:
            connection.abort()


class HttpTransport(Transport):
    """Requests and control calls to one server over HTTP (docs/internals/transport.md)."""

    name = "http"

    def __init__(self, settings: ServerSettings, *, max_connections: int = 8,
                 compression: Compression | None = None) -> None:
        if compression is None:  # the setting (default none)
            configured = configured_compression()
            compression = None if configured == "none" else configured  # type: ignore[assignment]
        if compression not in (None, "gzip", "deflate"):
            raise ConfigurationError(
                f"compression must be None, 'gzip' or 'deflate', not {compression!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) \
                or max_connections < 1:
            raise ConfigurationError(f"max_connections must be an int >= 1, not {max_connections!r}")
        if settings.protocol != "http":  # the restricted-API key goes under its own name
            settings = dataclasses.replace(settings, protocol="http")
        self.settings = settings
        self.address = settings.address
        self.host, self.port = parse_address(settings.address, what="Triton HTTP address",
                                             default_port=DEFAULT_HTTP_PORT)
        self.max_connections = max_connections
        self.compression = compression
        #: requests answered, tensor bytes sent and received, connections opened (this process)
        self.stats = {"requests": 0, "bytes_sent": 0, "bytes_received": 0, "connections": 0}
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._idle: list[Connection] = []
        self._executor: ThreadPoolExecutor | None = None
        self._context: ssl.SSLContext | None = None
        self._common: bytes | None = None

    def __reduce__(self):
        # configuration only: every process makes its own sockets, threads and TLS context
        return (functools.partial(HttpTransport, max_connections=self.max_connections,
                                  compression=self.compression), (self.settings,))

    def __repr__(self) -> str:
        extra = f", compression={self.compression!r}" if self.compression else ""
        return f"{type(self).__name__}({self.address!r}{extra})"

    # -- connections --------------------------------------------------------------------------------

    def _prepared(self) -> bytes:
        """The header lines every request carries (made once per process: TLS files and
        secrets are read here, in the process that sends)."""
        if self._pid != os.getpid():  # forked: the parent's sockets and threads are not ours
            self._reset()
        common = self._common
        if common is None:
            tls = self.settings.tls
            host = tls.server_name if tls is not None and tls.server_name else self.host
            host = f"[{host}]" if ":" in host else host
            try:
                self._context = ssl_context(tls) if tls is not None else None
                lines = [("Host", f"{host}:{self.port}"), *self.settings.metadata()]
                if any(c in text for line in lines for text in line for c in "\r\n\0"):
                    raise ConfigurationError("a header name or value contains a line break")
                common = "".join(f"{name}: {value}\r\n" for name, value in lines).encode("latin-1")
            except (ConfigurationError, OSError, ValueError) as error:
                raise TransportError("unauthenticated", f"cannot set up TLS or headers: {error}",
                                     address=self.address) from None
            self._common = common
        return common

    def _take(self, deadline: float) -> Connection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.stats["connections"] += 1
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed before connecting")
        tls = self.settings.tls
        return Connection(self.host, self.port, left, self._context,
                          tls.server_name if tls is not None else None)

    def _give_back(self, connection: Connection) -> None:
        if connection.pid == os.getpid():
            with self._lock:
                if len(self._idle) < self.max_connections:
                    self._idle.append(connection)
                    return
        connection.close()

    def _exchange(self, method: str, path: str, parts: Sequence[Any], timeout_s: float,
                  extra: Sequence[tuple[str, Any]] = (), call: _Call | None = None) -> Response:
        """One request and its answer; failures of the wire as TransportError."""
        common = self._prepared()
        deadline = time.monotonic() + timeout_s
        length = sum(memoryview(part).nbytes for part in parts)
        head = b"".join([f"{method} {path} HTTP/1.1\r\n".encode(), common,
                         "".join(f"{name}: {value}\r\n" for name, value in extra).encode(),
                         f"Content-Length: {length}\r\n\r\n".encode()])
        for attempt in (0, 1):
            connection = None
            try:
                connection = self._take(deadline)
                if call is not None:
                    call.connection = connection
                    if call.future.cancelled():
                        raise ConnectionAbortedError("cancelled")
                response = connection.exchange(head, parts, deadline)
            except (OSError, ValueError) as error:
                if connection is not None:
                    connection.close()
                if call is not None and call.future.cancelled():
                    raise TransportError("cancelled", "request cancelled",
                                         address=self.address) from None
                if (attempt == 0 and connection is not None and connection.used
                        and isinstance(error, _STALE)):
                    continue  # a kept-alive connection the server had closed: once more, fresh
                raise self._wire_error(error, method, path) from None
            if response.keep_alive:
                self._give_back(connection)
            else:
                connection.close()
            return response
        raise AssertionError("unreachable")

    def _wire_error(self, error: BaseException, method: str, path: str) -> TransportError:
        kind = "down"
        if isinstance(error, TimeoutError):
            kind = "timeout"
        elif isinstance(error, ssl.SSLError) and "CERTIFICATE" in str(error.reason).upper():
            kind = "unauthenticated"  # the server's certificate refused, or ours
        hint = _PORT_HINT if isinstance(error, (ConnectionRefusedError, ProtocolError)) else ""
        return TransportError(kind, f"{method} {path}: {type(error).__name__}: {error}{hint}",
                              address=self.address)

    def _status_error(self, response: Response, body: Any = None) -> TransportError:
        message = error_message(response.body if body is None else body)
        return from_http_status(response.status, message or f"HTTP {response.status}",
                                self.address, response.headers)

    # -- inference ----------------------------------------------------------------------------------

    def submit(self, request: InferRequest) -> TransportFuture:
        future = TransportFuture()
        call = _Call(future)
        future.on_cancel = call.abort
        try:
            self._prepared()
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self.max_connections,
                                                        thread_name_prefix="csonic-http")
                self._executor.submit(self._run, request, call)
        except TransportError as error:
            future.fail(error)
        except RuntimeError as error:  # interpreter shutting down
            future.fail(TransportError("down", str(error), address=self.address))
        return future

    def _run(self, request: InferRequest, call: _Call) -> None:
        if call.future.done():  # cancelled while queued
            return
        try:
            call.future.resolve(self._infer(request, call))
        except (TransportError, InferenceError) as error:
            call.future.fail(error)
        except Exception as error:  # noqa: BLE001 - never lose an error in a pool thread
            call.future.fail(InferenceError(f"model {request.model!r} at {self.address}: "
                                            f"{type(error).__name__}: {error}"))

    def infer(self, request: InferRequest) -> InferAnswer:
        """Send ``request`` and wait for the answer, in this thread."""
        return self._infer(request)

    def _infer(self, request: InferRequest, call: _Call | None = None) -> InferAnswer:
        try:
            header, blobs = encode_inputs(request.inputs, request.outputs,
                                          request.request_id, request.priority)
        except (KeyError, TypeError, ValueError) as error:
            raise TransportError("bad_request", f"cannot encode the inputs: {error!r}",
                                 address=self.address) from None
        sent = sum(memoryview(blob).nbytes for blob in blobs)
        parts: list[Any] = [header, *blobs]
        extra: list[tuple[str, Any]] = [("Content-Type", "application/octet-stream"),
                                        ("Inference-Header-Content-Length", len(header)),
                                        *request.headers]
        if self.compression:
            parts = compress(self.compression, parts)
            extra += [("Content-Encoding", self.compression), ("Accept-Encoding", self.compression)]
        path = _model_path(request.model, request.version) + "/infer"
        response = self._exchange("POST", path, parts, request.timeout_s, extra, call)
        body: Any = response.body
        encoding = response.headers.get("content-encoding", "identity").lower()
        what = f"model {request.model!r} at {self.address}"
        try:
            if encoding != "identity":
                body = decompress(encoding, body)
            if response.status != 200:
                raise self._status_error(response, body)
            header_length = int(response.headers.get("inference-header-content-length", len(body)))
            version, arrays, received = decode_outputs(body, header_length)
        except InferenceError as wrong:  # the server's answer is malformed: not retried
            raise InferenceError(f"{what}: {wrong}") from None
        except ValueError as error:  # a header length that is not a number
            raise InferenceError(f"{what}: unreadable answer ({error})") from None
        with self._lock:
            self.stats["requests"] += 1
            self.stats["bytes_sent"] += sent
            self.stats["bytes_received"] += received
        return answer_from(request, arrays, version=version, nbytes=received)

    # -- control calls ------------------------------------------------------------------------------

    def _get(self, path: str, timeout_s: float, body: bytes = b"") -> Any:
        """The JSON answer of GET ``path`` (POST ``body`` when given)."""
        response = self._exchange("POST" if body else "GET", path, [body] if body else [],
                                  timeout_s, [("Content-Type", "application/json")] if body else ())
        if response.status != 200:
            raise self._status_error(response)
        try:
            return json.loads(bytes(response.body))
        except ValueError as error:
            raise TransportError("internal", f"{path}: answer is not JSON ({error})",
                                 address=self.address) from None

    def _parse(self, data: Any, message: Any, what: str) -> Any:
        from google.protobuf import json_format

        try:
            return json_format.ParseDict(data, message, ignore_unknown_fields=True)
        except (json_format.ParseError, TypeError, ValueError) as error:
            raise TransportError("internal", f"cannot read the {what}: {error}",
                                 address=self.address) from None

    def _status(self, path: str, timeout_s: float) -> bool:
        response = self._exchange("GET", path, (), timeout_s)
        if response.status in (401, 403):  # refused: not an answer about readiness
            raise self._status_error(response)
        return response.status == 200

    def ready(self, timeout_s: float) -> bool:
        return self._status("/v2/health/ready", timeout_s)

    def model_ready(self, model: str, version: str, timeout_s: float) -> bool:
        """Whether ``model`` (``version``; ``""``: any) is loaded and ready on this server."""
        return self._status(_model_path(model, version) + "/ready", timeout_s)

    def model_index(self, timeout_s: float) -> dict[str, tuple[str, ...]]:
        from tritonclient.grpc import service_pb2

        entries = self._get("/v2/repository/index", timeout_s, b'{"ready":true}')
        return models_in_index(self._parse({"models": entries if isinstance(entries, list) else []},
                                           service_pb2.RepositoryIndexResponse(),
                                           "repository index"))

    def model_info(self, model: str, version: str, timeout_s: float) -> ModelInfo:
        from tritonclient.grpc import model_config_pb2, service_pb2

        path = _model_path(model, version)
        metadata = self._parse(self._get(path, timeout_s), service_pb2.ModelMetadataResponse(),
                               "model metadata")
        # the config JSON uses the proto's field names; the gRPC answer wraps it in "config"
        config = self._parse(self._get(path + "/config", timeout_s),
                             model_config_pb2.ModelConfig(), "model config")
        return model_info_from_responses(metadata, service_pb2.ModelConfigResponse(config=config))

    def statistics(self, model: str, version: str, timeout_s: float) -> ServerStatistics:
        from tritonclient.grpc import service_pb2

        answer = self._get(_model_path(model, version) + "/stats", timeout_s)
        return statistics_from_response(self._parse(answer, service_pb2.ModelStatisticsResponse(),
                                                    "model statistics"), model)

    def server_metadata(self, timeout_s: float) -> dict[str, Any]:
        """Server name, version and extensions (for ``coffea-sonic check``)."""
        answer = self._get("/v2", timeout_s)
        return {"name": answer.get("name", ""), "version": answer.get("version", ""),
                "extensions": list(answer.get("extensions", []))}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "tls": self.settings.tls is not None,
                "compression": self.compression, "max_connections": self.max_connections,
                **self.stats}

    def close(self) -> None:
        """Close idle connections and let the request threads end (usable again afterwards)."""
        if self._pid != os.getpid():
            self._reset()
            return
        with self._lock:
            idle, self._idle = self._idle, []
            executor, self._executor = self._executor, None
        for connection in idle:
            connection.close()
        if executor is not None:
            executor.shutdown(wait=False)


def _model_path(model: str, version: str) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    return path + f"/versions/{quote(version, safe='')}" if version else path
