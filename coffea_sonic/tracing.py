"""W3C trace context on every request: one trace per chunk, followed from the Dask task to Triton.

How it works, with examples: docs/internals/incidents.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import logging
import secrets
from typing import TYPE_CHECKING, Iterator

from .dispatch import CallHooks

if TYPE_CHECKING:
    from .calls import Call, Piece
    from .transport.base import InferRequest

__all__ = ["TraceHook", "chunk_trace", "chunk_trace_id", "current_trace", "format_traceparent"]

logger = logging.getLogger(__name__)

#: the trace id of the chunk being processed in this thread (or task), if any
_chunk: contextvars.ContextVar[str | None] = contextvars.ContextVar("coffea_sonic_trace",
                                                                    default=None)


def format_traceparent(trace_id: str, span_id: str) -> str:
    """The W3C ``traceparent`` value (version 00, sampled)."""
    return f"00-{trace_id}-{span_id}-01"


def chunk_trace_id(label: str, run: str = "") -> str:
    """The trace id of the chunk ``label`` in run ``run``: the same on every worker and for every
    retry of the chunk, different between runs (32 hex digits, never all zero)."""
    digest = hashlib.sha256(f"{run}\0{label}".encode()).hexdigest()[:32]
    return digest if digest.strip("0") else "1" + digest[1:]


def current_trace() -> str | None:
    """The trace id of the chunk being processed here, or None outside :func:`chunk_trace`."""
    return _chunk.get()


@contextlib.contextmanager
def chunk_trace(label: str, *, run: str = "") -> Iterator[str]:
    """Calls made inside share one trace id (the chunk's; see :func:`chunk_trace_id`)."""
    trace_id = chunk_trace_id(label, run)
    if _chunk.get() != trace_id:
        logger.info("coffea-sonic: chunk %s: trace %s", label, trace_id)
    token = _chunk.set(trace_id)
    try:
        yield trace_id
    finally:
        _chunk.reset(token)


class TraceHook(CallHooks):
    """The call hook that puts a ``traceparent`` on every request (every ``TritonModel`` has
    one). Stateless, so it pickles to Dask workers."""

    def on_call(self, call: "Call") -> None:
        trace_id = _chunk.get() or secrets.token_hex(16)
        parent = format_traceparent(trace_id, secrets.token_hex(8))
        call.context["traceparent"] = parent
        logger.info("coffea-sonic: call %d (%d rows in %d requests): traceparent %s",
                    call.call_id, call.rows, len(call.pieces), parent)

    def decorate(self, piece: "Piece", request: "InferRequest") -> "InferRequest":
        parent = piece.call.context.get("traceparent")
        if not parent:
            return request
        return dataclasses.replace(request, headers=(*request.headers, ("traceparent", parent)))

    def __repr__(self) -> str:
        return "TraceHook()"
