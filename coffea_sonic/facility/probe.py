"""Low-level network probes: is anything listening, and does it speak gRPC, TLS or plain HTTP/1?

>>> tcp_connect("127.0.0.1", 1, timeout_s=1).error in ("refused", "unreachable", "timeout")
True
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Literal

__all__ = ["ConnectResult", "Protocol", "TlsResult", "identify_http_port", "sniff_protocol",
           "tcp_connect", "tls_handshake"]

#: What a port speaks, as far as :func:`sniff_protocol` can tell.
Protocol = Literal["h2", "tls", "http1", "silent", "closed", "other"]

# HTTP/2 client connection preface and an empty SETTINGS frame (RFC 9113, 3.4 and 6.5).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS_TYPE = 0x04
_TLS_RECORD_TYPES = (0x15, 0x16)  # alert, handshake


@dataclass(frozen=True)
class ConnectResult:
    """Outcome of one TCP connect: ``error`` is None, refused, timeout, unreachable or dns."""

    seconds: float
    error: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


def tcp_connect(host: str, port: int, timeout_s: float = 3.0) -> ConnectResult:
    """Open and close one TCP connection to ``host:port``; classify a failure.

    >>> tcp_connect("no-such-host.invalid", 8001).error
    'dns'
    """
    started = time.perf_counter()
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        return ConnectResult(time.perf_counter() - started, "dns", str(error))
    last: ConnectResult | None = None
    for family, kind, proto, _, address in addresses:
        started = time.perf_counter()
        try:
            with socket.socket(family, kind, proto) as connection:
                connection.settimeout(timeout_s)
                connection.connect(address)
            return ConnectResult(time.perf_counter() - started)
        except ConnectionRefusedError as error:
            last = ConnectResult(time.perf_counter() - started, "refused", str(error))
        except (socket.timeout, TimeoutError) as error:
            last = ConnectResult(time.perf_counter() - started, "timeout", str(error) or "timed out")
        except OSError as error:
            last = ConnectResult(time.perf_counter() - started, "unreachable", str(error))
    assert last is not None
    return last


def sniff_protocol(host: str, port: int, timeout_s: float = 2.0) -> tuple[Protocol, bytes]:
    """Send the HTTP/2 preface and classify the first bytes of the answer.

    An HTTP/2 server (gRPC) answers with a SETTINGS frame, an HTTP/1 server with ``HTTP/1.x``,
    a TLS server with a TLS alert or by closing; returns the class and the first bytes read.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as connection:
            connection.sendall(_H2_PREFACE)
            answer = b""
            while len(answer) < 9:
                chunk = connection.recv(64)
                if not chunk:
                    break
                answer += chunk
    except (socket.timeout, TimeoutError):
        return "silent", b""
    except ConnectionResetError:
        return "closed", b""
    except OSError:
        return "closed", b""
    if not answer:
        return "closed", b""
    if answer.startswith(b"HTTP/"):
        return "http1", answer
    if len(answer) >= 4 and answer[3] == _H2_SETTINGS_TYPE:
        return "h2", answer
    if answer[0] in _TLS_RECORD_TYPES:
        return "tls", answer
    return "other", answer


@dataclass(frozen=True)
class TlsResult:
    """Outcome of a TLS handshake: ``speaks_tls``; ``verified`` with the given trust; details."""

    speaks_tls: bool
    verified: bool = False
    version: str = ""
    peer_subject: str = ""
    alpn: str | None = None
    error: str = ""


def _subject(certificate: dict) -> str:
    parts = [f"{key}={value}" for entry in certificate.get("subject", ()) for key, value in entry]
    return ", ".join(parts)


def tls_handshake(host: str, port: int, *, ca_file: str | None = None,
                  server_name: str | None = None, cert_file: str | None = None,
                  key_file: str | None = None, timeout_s: float = 3.0) -> TlsResult:
    """Handshake twice if needed: without verification (does it speak TLS?), then verifying.

    ``ca_file`` None verifies against the system roots; ``server_name`` overrides the name checked.
    """
    def context(verify: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=ca_file) if verify else ssl.SSLContext(
            ssl.PROTOCOL_TLS_CLIENT)
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cert_file:
            ctx.load_cert_chain(cert_file, key_file)
        ctx.set_alpn_protocols(["h2"])  # what gRPC offers
        return ctx

    name = server_name or host
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            with context(False).wrap_socket(raw, server_hostname=name):
                pass
    except (ssl.SSLError, OSError) as error:
        return TlsResult(False, error=str(error))
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            with context(True).wrap_socket(raw, server_hostname=name) as secured:
                return TlsResult(True, True, secured.version() or "", _subject(secured.getpeercert()),
                                 secured.selected_alpn_protocol())
    except ssl.SSLCertVerificationError as error:
        return TlsResult(True, False, error=error.verify_message or str(error))
    except (ssl.SSLError, OSError) as error:
        return TlsResult(True, False, error=str(error))


def identify_http_port(host: str, port: int, timeout_s: float = 2.0) -> str | None:
    """What answers plain HTTP/1 on ``host:port``: Triton's "metrics" or "http" port, another
    "http1" server, or None (no HTTP/1 answer).

    >>> identify_http_port("127.0.0.1", 1) is None
    True
    """
    base = f"http://{host}:{port}"
    answered = False
    for path, kind in (("/metrics", "metrics"), ("/v2/health/live", "http")):
        try:
            with urllib.request.urlopen(f"{base}{path}", timeout=timeout_s) as response:
                answered = True
                body = response.read(1 << 20)
                if kind == "metrics" and b"nv_" in body:
                    return kind
                if kind == "http" and response.status == 200 and not body:
                    return kind
        except urllib.error.HTTPError:
            answered = True
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
            pass
    return "http1" if answered else None
