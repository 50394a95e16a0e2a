"""Per-process, fork-safe pool of gRPC channels (docs/internals/transport.md, Channels)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from ...core.process_local import ProcessLocal
from ...core.tls import TlsOptions

__all__ = ["Connection", "channel_options", "close_all", "get_connection", "pool_size"]

logger = logging.getLogger(__name__)

#: gRPC's hard limit on one message (tritonclient's default for both directions).
INT32_MAX = 2**31 - 1
#: The longest a channel waits before it tries a refused server again; until then it fails
#: every call at once, even if a server is back on that address.
MAX_BACKOFF_S = 2.0
#: How long a refused call on a used channel waits for the channel's next try (the backoff plus
#: gRPC's 20 % jitter): its refusal may be the memory of an earlier try.
RECONNECT_WAIT_S = 1.25 * MAX_BACKOFF_S


def channel_options(tls: TlsOptions | None = None) -> list[tuple[str, Any]]:
    """Channel arguments: tritonclient's defaults (which ``channel_args`` would drop) plus ours."""
    options: list[tuple[str, Any]] = [
        # tritonclient's defaults, re-added because passing any options replaces them
        ("grpc.max_send_message_length", INT32_MAX),
        ("grpc.max_receive_message_length", INT32_MAX),
        ("grpc.keepalive_time_ms", INT32_MAX),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", False),
        ("grpc.http2.max_pings_without_data", 2),
        # ours: notice a restarted server quickly instead of backing off for up to 2 minutes
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", int(MAX_BACKOFF_S * 1000)),
        # one connection per (server, settings) per process, not a process-global shared one
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if tls is not None:
        options += tls.channel_options()
    return options


@dataclass
class Connection:
    """One gRPC channel and Triton stub to ``address``, owned by process ``pid``."""

    address: str
    tls: TlsOptions | None
    channel: Any
    stub: Any
    pid: int = field(default_factory=os.getpid)
    #: whether a call went over it: then a refusal may be its memory of an earlier try
    used: bool = False

    def close(self) -> None:
        self.channel.close()


#: this process' channels (a forked child opens its own; the parent's are never closed there)
_pool: ProcessLocal[tuple, Connection] = ProcessLocal("gRPC channels")


def _make_connection(address: str, tls: TlsOptions | None) -> Connection:
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    options = channel_options(tls)
    if tls is None:
        channel = grpc.insecure_channel(address, options=options)
    else:
        channel = grpc.secure_channel(address, tls.credentials(), options=options)
    logger.debug("opened gRPC channel to %s (pid %d, tls=%s)", address, os.getpid(), tls is not None)
    return Connection(address=address, tls=tls,
                      channel=channel, stub=service_pb2_grpc.GRPCInferenceServiceStub(channel))


def get_connection(address: str, tls: TlsOptions | None = None,
                   headers_fingerprint: str = "", index: int = 0) -> Connection:
    """The pooled connection ``index`` of this process to ``address`` with these settings (made
    on demand; each index is its own HTTP/2 connection).

    >>> a = get_connection("127.0.0.1:1")
    >>> a is get_connection("127.0.0.1:1") and a.pid == os.getpid()
    True
    >>> get_connection("127.0.0.1:1", index=1) is a
    False
    """
    key = (address, tls.key() if tls is not None else None, headers_fingerprint, index)
    return _pool.get(key, lambda: _make_connection(address, tls))


def pool_size() -> int:
    """Number of channels this process holds (for tests and the soak check)."""
    return len(_pool)


def close_all() -> None:
    """Close every channel of this process (e.g. at the end of a worker's life)."""
    for connection in _pool.clear():
        connection.close()
