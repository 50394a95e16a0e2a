"""Triton's HTTP/REST API: transport and socket-level wire (docs/internals/transport.md)."""

from .transport import Compression, HttpTransport

__all__ = ["Compression", "HttpTransport"]
