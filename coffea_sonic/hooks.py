"""The extension points of a call (:class:`CallHooks`) and what they are told (:class:`PieceAnswer`).

When each is asked, with an example: docs/internals/dispatch.md.

>>> CallHooks().lookup(None) is None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .calls import Call, Piece
from .transport.base import InferRequest

__all__ = ["CallHooks", "PieceAnswer"]


@dataclass(frozen=True)
class PieceAnswer:
    """A piece's checked outputs and where they came from (for :meth:`CallHooks.on_answer`)."""

    piece: Piece
    outputs: Mapping[str, np.ndarray]
    #: the server's ``host:port``, ``"fallback engine"``, or ``"hook"`` (a hook's lookup)
    source: str
    model: str
    #: the version that answered (the requested one where the answer does not say)
    version: str

    @property
    def rows(self) -> int:
        return self.piece.rows


class CallHooks:
    """Extension points of the call machinery (docs/internals/dispatch.md); each does nothing
    here. Hooks run in transport threads: keep them quick and thread-safe."""

    def on_call(self, call: Call) -> None:
        """A call was validated and split; nothing is sent yet."""

    def lookup(self, piece: Piece) -> Mapping[str, Any] | None:
        """Outputs for ``piece`` without a server (rows ``piece.start:piece.stop`` plus
        ``piece.pad`` padding rows), or None to send it."""
        return None

    def decorate(self, piece: Piece, request: InferRequest) -> InferRequest:
        """The request for ``piece`` as it should be sent."""
        return request

    def on_answer(self, answer: PieceAnswer) -> None:
        """A piece's outputs were checked and are about to be recorded."""
