"""Triton's HTTP/REST API: :class:`HttpTransport` and its socket-level :mod:`.wire`.

How it works: docs/internals/transport.md ("HTTP")."""

from .transport import Compression, HttpTransport

__all__ = ["Compression", "HttpTransport"]
