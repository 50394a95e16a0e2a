"""Request compression over gRPC and HTTP: the ``compression`` setting, read once per transport.

``none`` (the default), ``gzip`` or ``deflate``: Triton decompresses either. Compressing costs
the client CPU and saves link bytes only as far as the tensors compress: what the zoo's inputs
gain on a 1 and a 10 Gb/s link is in benchmarks/RESULTS.md, and why the default stays ``none``.
Set it where the link is slow (``COFFEA_SONIC_COMPRESSION=gzip``, Dask config
``coffea_sonic.compression``, or ``compression = "gzip"`` in the endpoints file).

>>> configured_compression("GZIP"), configured_compression(None) in COMPRESSIONS
('gzip', True)
"""

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
