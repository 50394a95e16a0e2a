"""One transport per process, server settings and kind (docs/internals/transport.md)."""

from __future__ import annotations

import atexit
import importlib
import logging
from typing import Any

from ..core.endpoint import ServerSettings
from ..core.process_local import ProcessLocal
from ..errors import ConfigurationError
from .base import Transport
from .kinds import KINDS as _TABLE, REQUESTABLE

__all__ = ["KINDS", "close_all_transports", "open_transport"]

logger = logging.getLogger(__name__)

#: transport kinds made from server settings (:mod:`.kinds`)
KINDS = REQUESTABLE[1:]

#: this process' transports (a forked child makes its own and never closes its parent's)
_transports: ProcessLocal[tuple[Any, ...], Transport] = ProcessLocal("transports")


def _make(settings: ServerSettings, kind: str) -> Transport:
    entry = _TABLE.get(kind)
    if entry is None or not entry.factory:
        raise ConfigurationError(f"transport kind must be one of {', '.join(KINDS)}, not {kind!r}")
    module, _, name = entry.factory.partition(":")
    return getattr(importlib.import_module(module), name)(settings)


def open_transport(settings: ServerSettings, kind: str) -> Transport:
    """This process' transport of ``kind`` to the server ``settings`` describe."""
    return _transports.get((settings.key(), kind), lambda: _make(settings, kind))


def close_all_transports() -> None:
    """Close every transport of this process (at interpreter exit, and in tests)."""
    for transport in _transports.clear():
        try:
            transport.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            logger.debug("closing %r failed", transport, exc_info=True)


atexit.register(close_all_transports)
