"""A piece no server can serve now: fall back, wait for a server, or fail the call.

Decided for :class:`~coffea_sonic.dispatch.CallRunner`, which calls these; how:
docs/internals/dispatch.md.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from . import fallback as fallback_module
from . import incidents
from .calls import Piece, piece_tensors
from .errors import ModelNotFoundError, QuotaExceededError, ServerUnavailableError
from .retry import call_later

#: the runner (:class:`~coffea_sonic.dispatch.CallRunner`; not imported: it imports this module)
CallRunner = Any

__all__ = ["give_up", "no_server", "run_fallback"]

logger = logging.getLogger("coffea_sonic.dispatch")


def no_server(runner: CallRunner, piece: Piece) -> None:
    """No healthy server serves the model right now: fall back, wait for one, or give up."""
    router = runner.router
    if not router.could_serve(runner.model_name, runner.version):
        runner.fail(piece.call, ModelNotFoundError(
            f"no server serves {runner._what()} any more; "
            f"{router.describe(runner.model_name, runner.version)}"))
        return
    if runner.owner.fallback is not None:
        run_fallback(runner, piece, router.describe(runner.model_name, runner.version))
        return
    left = piece.deadline - time.monotonic()
    if left <= 0:
        give_up(runner, piece, "no healthy server left")
        return
    # wait for the health thread to re-admit a server (or for the deadline)
    wait = min(left, max(router.seconds_until_probe(), runner.owner.retry.backoff_s(1)) + 0.05)
    if not piece.waiting_logged:  # once per piece: what it waits for, and how long it may
        piece.waiting_logged = True
        incidents.record("waited", model=runner.model_name, chunk=piece.call.chunk,
                         rows=piece.rows, detail=f"up to {left:.0f} s")
        logger.warning("coffea-sonic: %s rows %d-%d wait for a server to come back (up to "
                       "%.0f s more of the retry policy's total_s %g; no fallback is set): %s",
                       runner._what(), piece.start, piece.stop, left,
                       runner.owner.retry.total_s, router.describe(runner.model_name,
                                                                 runner.version))
    call_later(wait, lambda: runner.window.submit_first([piece]))

def give_up(runner: CallRunner, piece: Piece, why: str) -> None:
    call = piece.call
    servers = runner.router.describe(runner.model_name, runner.version)
    elapsed = time.monotonic() - piece.first_try if piece.first_try else 0.0
    if piece.quota_refusal:  # the servers are fine: the user is over a quota
        runner.fail(call, QuotaExceededError(
            f"{runner._what()}: {piece.last_address} refused rows {piece.start}-{piece.stop} "
            f"over a quota until the deadline ({elapsed:.1f} s, retry total_s "
            f"{runner.owner.retry.total_s:g}): {piece.quota_refusal}. Send less at once "
            "(fewer workers or max_in_flight), or ask the facility for a larger quota"))
        return
    if runner.owner.fallback is not None:
        run_fallback(runner, piece, f"{why}; {servers}")
        return
    incidents.record("gave_up", model=runner.model_name, chunk=call.chunk, rows=piece.rows,
                     detail=f"{why}, {elapsed:.1f} s")
    errors = "; ".join(f"{address}: {error}" for address, error in piece.errors.items())
    runner.fail(call, ServerUnavailableError(
        f"{runner._what()}: no server could serve rows {piece.start}-{piece.stop} of a "
        f"{call.rows}-row call ({why}, {elapsed:.1f} s); {servers}"
        + (f"; last errors: {errors}" if errors else "")
        + ". Start or fix a server, or enable the in-process fallback with fallback='cpu' "
          "(or COFFEA_SONIC_FALLBACK=cpu)"))

def run_fallback(runner: CallRunner, piece: Piece, reason: str) -> None:
    call = piece.call
    if call.error is not None:
        return
    choice = runner.owner.fallback
    call.fallback = True  # e.g. the inference cache does not store its outputs
    fallback_module.warn_fallback(runner.model_name, piece.rows, reason)
    incidents.record("fallback", model=runner.model_name, chunk=call.chunk, rows=piece.rows,
                     detail=reason)

    def work() -> None:
        try:
            engine = fallback_module.fallback_engine(choice, runner.model_name,
                                                     runner.version)
            produced = engine(piece_tensors(piece))
            runner._accept(piece, produced, "fallback engine", runner.version,
                         fallback_calls=1, fallback_rows=piece.rows)
        except Exception as error:  # noqa: BLE001 - the call must learn about it
            runner.fail(call, error)

    fallback_module.submit(work)
