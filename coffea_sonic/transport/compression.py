"""Request compression over gRPC and HTTP (when it pays: docs/internals/transport.md)."""

from __future__ import annotations

from ..core.settings import setting
from ..errors import ConfigurationError

__all__ = ["COMPRESSIONS", "configured_compression"]

COMPRESSIONS = ("none", "gzip", "deflate")


def configured_compression(given: str | None = None) -> str:
    """``given``, else the ``compression`` setting; checked and lower-cased."""
    value = str(given if given is not None else setting("compression") or "none").lower()
    if value not in COMPRESSIONS:
        raise ConfigurationError(f"compression must be one of {', '.join(COMPRESSIONS)}, not "
                                 f"{value!r} (setting compression / COFFEA_SONIC_COMPRESSION)")
    return value
