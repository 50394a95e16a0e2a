"""Transports: the wires to Triton servers, behind one interface (:class:`Transport`).

* :mod:`.base`: :class:`InferRequest`, :class:`InferAnswer`, :class:`TransportFuture`, the
  :class:`Transport` interface;
* :mod:`.errors`: :class:`TransportError` and the one classifier of failures;
* :mod:`.grpc`: Triton's gRPC API (remote servers; control calls of every transport);
* :mod:`.shm`: system and CUDA shared memory to a server on this host, on one slot pool;
* :mod:`.http`: Triton's HTTP API with binary tensors (``triton+http://``);
* :mod:`.memory`: in-process models, for fast unit tests;
* :mod:`.registry`: one transport per process, server and kind.

Nothing here knows about models' policies (splitting, retries, fallback): that is the client's.

>>> from coffea_sonic.transport import TransportError
>>> TransportError("busy", "queue full").retryable
True
"""

from .base import InferAnswer, InferRequest, Transport, TransportFuture
from .errors import TransportError, classify
from .registry import close_all_transports, open_transport

__all__ = ["InferAnswer", "InferRequest", "Transport", "TransportError", "TransportFuture",
           "classify", "close_all_transports", "open_transport"]
