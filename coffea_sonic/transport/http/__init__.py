"""Triton's HTTP/REST API: :class:`HttpTransport` and its socket-level :mod:`.wire`.

>>> from coffea_sonic.core.endpoint import ServerSettings
>>> HttpTransport(ServerSettings("127.0.0.1:8000", protocol="http"))
HttpTransport('127.0.0.1:8000')
"""

from .transport import Compression, HttpTransport

__all__ = ["Compression", "HttpTransport"]
