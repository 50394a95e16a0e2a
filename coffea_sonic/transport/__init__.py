"""Transports: the wires to Triton servers, behind one interface (docs/internals/transport.md)."""

from .base import InferAnswer, InferRequest, Transport, TransportFuture
from .errors import TransportError, classify
from .registry import close_all_transports, open_transport

__all__ = ["InferAnswer", "InferRequest", "Transport", "TransportError", "TransportFuture",
           "classify", "close_all_transports", "open_transport"]
