"""The engine of ``fallback="local"``: an embedded Triton server with the zoo model, per process.

Started once per process on first need (the client's fallback module caches the engine), stopped
when the process exits.
"""

from __future__ import annotations

import logging

__all__ = ["local_fallback_engine"]

logger = logging.getLogger("coffea_sonic.fallback")


def local_fallback_engine(model: str):
    """A TritonModel of ``model`` on a LocalTritonServer started here (kept alive with it)."""
    from ..model import TritonModel
    from .launcher import LocalTritonServer

    server = LocalTritonServer(models=[model], device="cpu").start()
    logger.warning("coffea-sonic: started a local fallback Triton server for %s at %s",
                   model, server.grpc_address)
    client = TritonModel(server.url(model), fallback="off")
    client._fallback_server = server  # keeps the server alive as long as the engine
    return client
