"""Triton's gRPC API: :class:`GrpcTransport`, its fork-safe channel pool and its codec.

>>> from coffea_sonic.transport.grpc import GrpcTransport, channel_options
>>> dict(channel_options())["grpc.max_send_message_length"] == 2**31 - 1
True
"""

from .channel import Connection, channel_options, close_all, get_connection
from .codec import decode_response, encode_request
from .transport import GrpcTransport

__all__ = ["Connection", "GrpcTransport", "channel_options", "close_all", "decode_response",
           "encode_request", "get_connection"]
