"""Triton's gRPC API: :class:`GrpcTransport`, its fork-safe channel pool and its codec.

How it works: docs/internals/transport.md ("gRPC")."""

from .channel import Connection, channel_options, close_all, get_connection
from .codec import decode_response, encode_request
from .transport import GrpcTransport

__all__ = ["Connection", "GrpcTransport", "channel_options", "close_all", "decode_response",
           "encode_request", "get_connection"]
