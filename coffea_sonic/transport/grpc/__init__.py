"""Triton's gRPC API: transport, channel pool, codec (docs/internals/transport.md)."""

from .channel import Connection, channel_options, close_all, get_connection
from .codec import decode_response, encode_request
from .transport import GrpcTransport

__all__ = ["Connection", "GrpcTransport", "channel_options", "close_all", "decode_response",
           "encode_request", "get_connection"]
