"""Triton's HTTP/REST endpoint with the binary-tensor extension, sent with the fewest copies.

For large payloads to a server on *another* host this is the fastest network path measured here
(see ``benchmarks/transport/RESULTS-transport.md``): a request is one small JSON header followed by
the tensors' own bytes, written straight from the numpy arrays to the socket (``sendall`` on a
memoryview: no serialisation copy, and the GIL is released while the kernel copies), and the
answer is read with ``readinto`` into one buffer that the output arrays then view. gRPC's Python
client, by contrast, copies every tensor into a protobuf message and again into gRPC's buffers
while holding the GIL.

Optional ``compression="gzip"`` or ``"deflate"`` compresses requests and asks for compressed
answers (``Content-Encoding`` / ``Accept-Encoding``, both understood by Triton): worth it only on
slow wide-area links, since it costs far more CPU than it saves on a fast network.

Connections are kept alive in a per-transport pool (one per request in flight); requests of
:meth:`HttpBinaryTransport.submit` run on a small thread pool, which overlaps well because the
socket calls release the GIL.

>>> transport = HttpBinaryTransport("127.0.0.1:8000", compression="gzip")
>>> transport
HttpBinaryTransport('127.0.0.1:8000', compression='gzip')
>>> transport.close()

With a server running (``LocalTritonServer`` gives ``server.http_address``)::

    transport = HttpBinaryTransport(server.http_address)
    outputs = transport.infer("jet_tagger", "", {"features": features}, [("probs", "FP32", (3,))])
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import socket
import ssl
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np

from ..errors import (ConfigurationError, InferenceError, InputValidationError, ModelNotFoundError,
                      ServerUnavailableError, SonicError)
from .codec import numpy_dtype, triton_dtype
from .shm import OutputSpec, TransportFuture

__all__ = ["Compression", "HttpBinaryTransport"]

logger = logging.getLogger(__name__)

Compression = Literal["gzip", "deflate"]
#: Socket buffer sizes asked for (the kernel may cap them): fewer wake-ups for large payloads.
SOCKET_BUFFER_BYTES = 4 << 20


class _Connection:
    """One keep-alive HTTP/1.1 connection (blocking socket; used by one request at a time)."""

    def __init__(self, host: str, port: int, timeout_s: float,
                 ssl_context: ssl.SSLContext | None) -> None:
        sock = socket.create_connection((host, port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
            except OSError:
                pass
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self.reader = sock.makefile("rb", buffering=1 << 16)
        self.pid = os.getpid()

    def close(self) -> None:
        try:
            self.reader.close()
            self.sock.close()
        except OSError:
            pass


class HttpBinaryTransport:
    """Requests to one Triton server over HTTP with binary tensors (any host).

    Parameters
    ----------
    address:
        ``host:port`` of the server's HTTP endpoint (Triton's default port is 8000).
    max_connections:
        Requests in flight at once through :meth:`submit` (one connection each).
    compression:
        ``None`` (default), ``"gzip"`` or ``"deflate"`` for requests and answers.
    ssl_context:
        An ``ssl.SSLContext`` for ``https`` endpoints (e.g. behind a TLS-terminating proxy).
    headers:
        Extra HTTP headers for every request (e.g. resolved ``authorization``).

    The interface matches :class:`~coffea_sonic.transport.shm.SystemShmTransport`:
    :meth:`submit` returns a :class:`~coffea_sonic.transport.shm.TransportFuture`.
    """

    kind = "http"

    def __init__(self, address: str, *, max_connections: int = 8,
                 compression: Compression | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        from .url import parse_address

        if compression not in (None, "gzip", "deflate"):
            raise ConfigurationError(f"compression must be None, 'gzip' or 'deflate', not {compression!r}")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ConfigurationError(f"max_connections must be an int >= 1, not {max_connections!r}")
        self.address = address
        self.host, self.port = parse_address(address, what="Triton HTTP address")
        self.max_connections = max_connections
        self.compression = compression
        self.ssl_context = ssl_context
        self.headers = dict(headers or {})
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self.stats = {"requests": 0, "bytes_sent": 0, "bytes_received": 0, "connections_made": 0}

    def __repr__(self) -> str:
        extra = f", compression={self.compression!r}" if self.compression else ""
        return f"HttpBinaryTransport({self.address!r}{extra})"

    def __reduce__(self):
        # configuration only: sockets and threads are made again in the receiving process
        return (_rebuild, (self.address, self.max_connections, self.compression, self.headers))

    def __enter__(self) -> "HttpBinaryTransport":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- connections --------------------------------------------------------------------------------
    def _take(self, timeout_s: float) -> _Connection:
        self._after_fork_check()
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.stats["connections_made"] += 1
        try:
            return _Connection(self.host, self.port, timeout_s, self.ssl_context)
        except OSError as error:
            raise ServerUnavailableError(
                f"cannot connect to Triton's HTTP endpoint at {self.address}: {error}; is the "
                "server running, and is this its HTTP port (default 8000), not the gRPC one?") from None

    def _give_back(self, connection: _Connection) -> None:
        with self._lock:
            if len(self._idle) < self.max_connections:
                self._idle.append(connection)
                return
        connection.close()

    def _after_fork_check(self) -> None:
        if self._pid != os.getpid():  # sockets and threads of the parent are not ours
            self._pid = os.getpid()
            self._idle = []
            self._lock = threading.Lock()
            self._executor = None

    # -- requests -----------------------------------------------------------------------------------
    def infer(self, model: str, version: str, inputs: Mapping[str, np.ndarray],
              outputs: Iterable[Any] = (), *, rows: int | None = -1, timeout_s: float = 60.0,
              metadata: Sequence[tuple[str, str]] = (), request_id: str = "") -> dict[str, np.ndarray]:
        """Run one request in this thread: ``{output name: array}``."""
        return self._roundtrip(model, version, inputs, [OutputSpec.coerce(o) for o in outputs],
                               timeout_s, metadata, request_id)

    def submit(self, model: str, version: str, inputs: Mapping[str, np.ndarray],
               outputs: Iterable[Any] = (), *, rows: int | None = -1, timeout_s: float = 60.0,
               metadata: Sequence[tuple[str, str]] = (), request_id: str = "") -> TransportFuture:
        """Send one request on the pool; the future completes with the outputs or our error.

        ``outputs`` names the outputs to return (empty: all of them); ``rows`` is accepted for
        interface compatibility (HTTP answers carry their own shapes).
        """
        self._after_fork_check()
        specs = [OutputSpec.coerce(o) for o in outputs]
        future = TransportFuture()
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_connections,
                                                    thread_name_prefix="csonic-http")
            executor = self._executor

        def run() -> None:
            try:
                result = self._roundtrip(model, version, inputs, specs, timeout_s, metadata,
                                         request_id)
            except BaseException as error:  # noqa: BLE001 - surfaced through the future
                future._set_error(error)
                return
            future._set_outputs(result, None)

        executor.submit(run)
        return future

    def _request_header(self, model: str, version: str, arrays: Mapping[str, np.ndarray],
                        blobs: list[Any], specs: Sequence[OutputSpec], request_id: str) -> bytes:
        described = []
        for (name, array), blob in zip(arrays.items(), blobs):
            described.append({"name": name, "shape": list(array.shape),
                              "datatype": triton_dtype(array.dtype),
                              "parameters": {"binary_data_size": memoryview(blob).nbytes}})
        body: dict[str, Any] = {"inputs": described}
        if request_id:
            body["id"] = request_id
        if specs:
            body["outputs"] = [{"name": spec.name, "parameters": {"binary_data": True}}
                               for spec in specs]
        else:
            body["parameters"] = {"binary_data_output": True}
        return json.dumps(body, separators=(",", ":")).encode()

    def _roundtrip(self, model: str, version: str, inputs: Mapping[str, np.ndarray],
                   specs: Sequence[OutputSpec], timeout_s: float,
                   metadata: Sequence[tuple[str, str]], request_id: str) -> dict[str, np.ndarray]:
        arrays = {name: np.asarray(array) for name, array in inputs.items()}
        blobs = [_binary(array) for array in arrays.values()]
        header = self._request_header(model, version, arrays, blobs, specs, request_id)
        payload = sum(memoryview(blob).nbytes for blob in blobs)
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        extra = dict(self.headers)
        extra.update({key: value for key, value in metadata})
        parts: list[Any] = [header, *blobs]
        if self.compression:
            compressor = _compressor(self.compression)
            parts = [compressor.compress(memoryview(part).cast("B")) for part in parts]
            parts.append(compressor.flush())
            extra["Content-Encoding"] = self.compression
            extra["Accept-Encoding"] = self.compression
        length = sum(memoryview(part).nbytes for part in parts)
        lines = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                 "Content-Type: application/octet-stream",
                 f"Inference-Header-Content-Length: {len(header)}",
                 f"Content-Length: {length}"]
        lines += [f"{key}: {value}" for key, value in extra.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode()
        what = f"model {model!r}" + (f" version {version}" if version else "")
        connection = self._take(timeout_s)
        try:
            connection.sock.settimeout(timeout_s)
            # the tensors go from the arrays' memory to the socket: no copy in Python
            connection.sock.sendall(head + bytes(parts[0]))  # HTTP head + JSON: small
            for part in parts[1:]:
                connection.sock.sendall(memoryview(part).cast("B"))
            status, headers, body = _read_response(connection.reader)
        except (OSError, ValueError) as error:
            connection.close()
            kind = "timed out" if isinstance(error, (socket.timeout, TimeoutError)) else "failed"
            raise ServerUnavailableError(
                f"HTTP request to Triton at {self.address} for {what} {kind}: "
                f"{type(error).__name__}: {error}") from None
        if headers.get("connection", "").lower() == "close":
            connection.close()
        else:
            self._give_back(connection)
        with self._lock:
            self.stats["requests"] += 1
            self.stats["bytes_sent"] += payload
            self.stats["bytes_received"] += len(body)
        encoding = headers.get("content-encoding", "").lower()
        if encoding:
            body = bytearray(_decompress(encoding, body))
        if status != 200:
            raise _http_error(status, body, what, self.address)
        header_length = int(headers.get("inference-header-content-length", len(body)))
        return _decode(body, header_length, model, self.address)

    def close(self) -> None:
        """Close idle connections and stop the request threads."""
        with self._lock:
            idle, self._idle = self._idle, []
            executor, self._executor = self._executor, None
        for connection in idle:
            connection.close()
        if executor is not None:
            executor.shutdown(wait=False)


def _rebuild(address: str, max_connections: int, compression: Compression | None,
             headers: dict) -> HttpBinaryTransport:
    return HttpBinaryTransport(address, max_connections=max_connections, compression=compression,
                               headers=headers)


def _binary(array: np.ndarray) -> Any:
    """The bytes Triton expects for ``array`` (a view of its memory when possible)."""
    if array.dtype == object or array.dtype.kind in "SU":
        from tritonclient.utils import serialize_byte_tensor

        serialized = serialize_byte_tensor(array)
        return serialized.item() if serialized.size else b""
    contiguous = np.ascontiguousarray(array)
    return memoryview(contiguous.reshape(-1).view(np.uint8)) if contiguous.size else b""


def _compressor(kind: str):
    if kind == "gzip":
        return zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return zlib.compressobj(1, zlib.DEFLATED, zlib.MAX_WBITS)


def _decompress(encoding: str, body: bytes | bytearray) -> bytes:
    if encoding == "gzip":
        return gzip.decompress(bytes(body))
    if encoding == "deflate":
        try:
            return zlib.decompress(bytes(body))
        except zlib.error:  # raw deflate without the zlib header
            return zlib.decompress(bytes(body), -zlib.MAX_WBITS)
    raise InferenceError(f"Triton answered with unsupported Content-Encoding {encoding!r}")


def _read_response(reader) -> tuple[int, dict[str, str], bytearray]:
    status_line = reader.readline(65536)
    if not status_line:
        raise ConnectionResetError("server closed the connection")
    parts = status_line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ValueError(f"not an HTTP response: {status_line[:80]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    while True:
        line = reader.readline(65536)
        if line in (b"\r\n", b"\n", b""):
            break
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            size = int(reader.readline(65536).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                reader.readline(65536)
                break
            body += _read_exactly(reader, size)
            reader.readline(65536)
        return status, headers, body
    return status, headers, _read_exactly(reader, int(headers.get("content-length", "0")))


def _read_exactly(reader, size: int) -> bytearray:
    body = bytearray(size)
    view = memoryview(body)
    received = 0
    while received < size:
        count = reader.readinto(view[received:])
        if not count:
            raise ConnectionResetError(f"connection closed after {received} of {size} bytes")
        received += count
    return body


def _decode(body: bytearray, header_length: int, model: str,
            address: str) -> dict[str, np.ndarray]:
    try:
        described = json.loads(bytes(body[:header_length]))
    except ValueError as error:
        raise InferenceError(f"model {model!r} at {address}: answer header is not JSON ({error})") from None
    outputs: dict[str, np.ndarray] = {}
    offset = header_length
    for tensor in described.get("outputs", []):
        dtype = numpy_dtype(tensor["datatype"])
        shape = tuple(int(d) for d in tensor["shape"])
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is None:  # answered as JSON (the server ignored binary_data)
            outputs[tensor["name"]] = np.asarray(tensor.get("data", []), dtype=dtype).reshape(shape)
            continue
        chunk = memoryview(body)[offset: offset + size]
        offset += size
        if dtype == object:
            from tritonclient.utils import deserialize_bytes_tensor

            outputs[tensor["name"]] = deserialize_bytes_tensor(bytes(chunk)).reshape(shape)
        else:
            expected = int(np.prod(shape)) * dtype.itemsize
            if size != expected:
                raise InferenceError(
                    f"model {model!r} output {tensor['name']!r}: {size} bytes for shape "
                    f"{list(shape)} {tensor['datatype']} (expected {expected})")
            outputs[tensor["name"]] = np.frombuffer(chunk, dtype=dtype).reshape(shape)
    return outputs


def _http_error(status: int, body: bytes | bytearray, what: str, address: str) -> SonicError:
    try:
        message = json.loads(bytes(body)).get("error", "")
    except ValueError:
        message = bytes(body[:200]).decode("utf-8", "replace")
    text = f"Triton at {address} answered HTTP {status} for {what}: {message}"
    lowered = message.lower()
    if status == 404 or "unknown model" in lowered or "not found" in lowered:
        return ModelNotFoundError(text)
    if status in (502, 503, 504) or "not ready" in lowered or "exceeds maximum queue" in lowered:
        return ServerUnavailableError(text)
    if status == 400 and ("input" in lowered or "shape" in lowered or "datatype" in lowered):
        return InputValidationError(text)
    return InferenceError(text)
