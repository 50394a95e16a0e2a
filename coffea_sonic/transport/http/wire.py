"""HTTP/1.1 on a plain socket: framing and binary tensors (docs/internals/transport.md)."""

from __future__ import annotations

import gzip
import json
import os
import socket
import ssl
import tempfile
import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from ...core.secrets import Secret
from ...core.tensors import TensorInfo, decode_tensor, numpy_dtype, tensor_bytes, triton_dtype
from ...core.tls import TlsOptions
from ...errors import InferenceError

__all__ = ["Connection", "Response", "compress", "decode_outputs", "decompress", "encode_inputs",
           "error_message", "ssl_context"]

#: Socket buffer sizes asked for (the kernel may cap them): fewer wake-ups for large payloads.
SOCKET_BUFFER_BYTES = 4 << 20
#: Requests up to this size go out in one ``sendall`` (one small copy beats several syscalls).
COALESCE_BYTES = 64 << 10
_LINE = 65536


def ssl_context(tls: TlsOptions) -> ssl.SSLContext:
    """A verifying client context: ``root_certificates`` (else the system's roots), and the
    client certificate for mutual TLS (a :class:`Secret` key goes through a 0600 file that is
    removed at once: ``ssl`` loads keys from files only)."""
    context = ssl.create_default_context(cafile=tls.root_certificates)
    if tls.certificate_chain is not None:
        if isinstance(tls.private_key, Secret):
            fd, path = tempfile.mkstemp(prefix="csonic-key-", suffix=".pem")
            try:
                with os.fdopen(fd, "w") as handle:
                    handle.write(tls.private_key.reveal())
                context.load_cert_chain(tls.certificate_chain, path)
            finally:
                os.unlink(path)
        else:
            context.load_cert_chain(tls.certificate_chain, tls.private_key)
    return context


@dataclass(slots=True)
class Response:
    """Status, lower-cased headers and body of one answer."""

    status: int
    headers: dict[str, str]
    body: bytearray
    keep_alive: bool


class Connection:
    """One keep-alive HTTP/1.1 connection (blocking socket, one request at a time)."""

    def __init__(self, host: str, port: int, timeout_s: float,
                 context: ssl.SSLContext | None, server_name: str | None = None) -> None:
        sock = socket.create_connection((host, port), timeout=timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
                except OSError:
                    pass
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=server_name or host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.reader = sock.makefile("rb", buffering=_LINE)
        self.pid = os.getpid()
        self.used = False  # True once an answer came back on it (then it may be stale when idle)

    def exchange(self, head: bytes, parts: Iterable[Any], deadline: float) -> Response:
        """Send ``head`` then ``parts`` (bytes-likes, sent from their memory), read the answer."""
        parts = [memoryview(part).cast("B") for part in parts]
        size = len(head) + sum(part.nbytes for part in parts)
        self._within(deadline)
        if size <= COALESCE_BYTES:
            self.sock.sendall(b"".join([head, *parts]))
        else:
            self.sock.sendall(head)
            for part in parts:
                self._within(deadline)
                self.sock.sendall(part)
        response = self._read(deadline)
        self.used = True
        return response

    def _within(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.sock.settimeout(left)

    def _read(self, deadline: float) -> Response:
        self._within(deadline)
        status_line = self.reader.readline(_LINE)
        if not status_line:
            raise ConnectionResetError("server closed the connection")
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.1 answer: {status_line[:40]!r}")
        headers: dict[str, str] = {}
        while True:
            line = self.reader.readline(_LINE)
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        keep_alive = (headers.get("connection", "").lower() != "close"
                      and parts[0] != "HTTP/1.0")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while True:
                size = int(self.reader.readline(_LINE).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.reader.readline(_LINE) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                body += self._exactly(size, deadline)
                self.reader.readline(_LINE)
        elif "content-length" in headers:
            body = self._exactly(int(headers["content-length"]), deadline)
        else:  # the answer ends when the server closes
            body, keep_alive = bytearray(self.reader.read()), False
        return Response(int(parts[1]), headers, body, keep_alive)

    def _exactly(self, size: int, deadline: float) -> bytearray:
        body = bytearray(size)
        view = memoryview(body)
        received = 0
        while received < size:
            self._within(deadline)
            count = self.reader.readinto(view[received:])
            if not count:
                raise ConnectionResetError(f"connection closed after {received} of {size} bytes")
            received += count
        return body

    def abort(self) -> None:
        """Stop a request in progress from another thread (its reads and writes then fail)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        for closable in (self.reader, self.sock):
            try:
                closable.close()
            except OSError:
                pass


class ProtocolError(OSError):
    """The peer does not speak HTTP/1.1 (e.g. a gRPC port)."""


def encode_inputs(inputs: Mapping[str, np.ndarray], outputs: Iterable[TensorInfo],
                  request_id: str = "", priority: int = 0) -> tuple[bytes, list[Any]]:
    """The inference header (JSON) and the tensors' bytes, in order; ``priority`` > 0 goes in
    the request's ``parameters`` (Triton's dynamic batcher level). ``outputs``: the outputs asked
    for (with their ``classification``, where set).

    >>> encode_inputs({}, (TensorInfo("y", "FP32", (1,)),), priority=2)[0]
    b'{"inputs":[],"outputs":[{"name":"y","parameters":{"binary_data":true}}],"parameters":{"priority":2}}'
    """
    described, blobs = [], []
    for name, array in inputs.items():
        array = np.asarray(array)
        blob = tensor_bytes(array)
        blobs.append(blob)
        described.append({"name": name, "shape": list(array.shape),
                          "datatype": triton_dtype(array.dtype),
                          "parameters": {"binary_data_size": memoryview(blob).nbytes}})
    body: dict[str, Any] = {"inputs": described}
    if request_id:
        body["id"] = request_id
    wanted = [_requested(output) for output in outputs]
    if wanted:
        body["outputs"] = wanted
    else:
        body["parameters"] = {"binary_data_output": True}
    if priority:
        body.setdefault("parameters", {})["priority"] = priority
    return json.dumps(body, separators=(",", ":")).encode(), blobs


def _requested(output: TensorInfo) -> dict[str, Any]:
    """One requested output: its bytes in the binary part, its top classes where asked."""
    parameters: dict[str, Any] = {"binary_data": True}
    if output.classification:
        parameters["classification"] = output.classification
    return {"name": output.name, "parameters": parameters}


def decode_outputs(body: Any, header_length: int) -> tuple[str, dict[str, np.ndarray], int]:
    """``(model_version, {name: array}, tensor bytes)`` of an answer body; the arrays view
    ``body``. ``InferenceError`` when the answer is malformed."""
    try:
        described = json.loads(bytes(body[:header_length]))
        outputs: dict[str, np.ndarray] = {}
        offset = header_length
        for tensor in described.get("outputs", []):
            name, dtype = tensor["name"], numpy_dtype(tensor["datatype"])
            shape = tuple(int(d) for d in tensor["shape"])
            size = (tensor.get("parameters") or {}).get("binary_data_size")
            if size is None:  # answered as JSON (the server ignored binary_data)
                outputs[name] = np.asarray(tensor.get("data", []), dtype=dtype).reshape(shape)
                continue
            chunk = memoryview(body)[offset: offset + size]
            offset += size
            if chunk.nbytes != size:  # the body ended before the size its header declared
                raise InferenceError(f"output {name!r}: {chunk.nbytes} of its {size} bytes arrived")
            outputs[name] = decode_tensor(name, tensor["datatype"], shape, chunk)
    except InferenceError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise InferenceError(f"unreadable answer ({type(error).__name__}: {error})") from None
    return str(described.get("model_version", "")), outputs, len(body) - header_length


def compress(kind: str, parts: Iterable[Any]) -> list[bytes]:
    """``parts`` as one gzip or deflate stream (level 1: cheap)."""
    wbits = 16 + zlib.MAX_WBITS if kind == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(1, zlib.DEFLATED, wbits)
    out = [compressor.compress(memoryview(part).cast("B")) for part in parts]
    out.append(compressor.flush())
    return out


def decompress(encoding: str, body: Any) -> bytes:
    """The body of an answer sent with ``Content-Encoding: encoding``."""
    try:
        if encoding == "gzip":
            return gzip.decompress(body)
        if encoding == "deflate":
            try:
                return zlib.decompress(body)
            except zlib.error:  # raw deflate without the zlib header
                return zlib.decompress(body, -zlib.MAX_WBITS)
    except (zlib.error, OSError, EOFError) as error:
        raise InferenceError(f"cannot decompress the {encoding} answer ({error})") from None
    raise InferenceError(f"answer has unsupported Content-Encoding {encoding!r}")


def error_message(body: Any) -> str:
    """The ``error`` of Triton's JSON error body, else the start of the body as text."""
    try:
        message = json.loads(bytes(body)).get("error")
        if isinstance(message, str):
            return message
    except (ValueError, AttributeError):
        pass
    return bytes(body[:300]).decode("utf-8", "replace").strip()
