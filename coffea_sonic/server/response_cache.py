"""Triton's response cache on the embedded server: one shared answer for identical requests.

Triton keys its cache on the whole request (model, version and every input's bytes), so it
serves users who send the very same requests (ten analysts running one tagger over one
dataset with the same chunking), not a rerun cut differently (the client-side
:mod:`coffea_sonic.cache` does that). It must be switched on twice: on the server
(``--cache-config local,size=BYTES``, with ``--cache-directory`` pointing at the bundled
``caches/local/libtritoncache_local.so``) and per model (config ``response_cache { enable:
true }``).

Inputs that arrive in CUDA shared memory are not hashed by Triton, so such requests always run
the model: with the cache on, ``transport="auto"`` sends through system shared memory or gRPC
instead (``ModelInfo.response_cache``, read from the served config).

>>> cache_directory(Path("/opt/tritonserver/bin/tritonserver"))
PosixPath('/opt/tritonserver/caches')
"""

from __future__ import annotations

from pathlib import Path

from ..errors import MissingDependencyError

__all__ = ["cache_directory", "server_flags"]


def cache_directory(binary: Path) -> Path:
    """The cache implementations beside the tritonserver ``binary`` (``<server>/caches``)."""
    return binary.parent.parent / "caches"


def server_flags(size_bytes: int, binary: Path) -> list[str]:
    """tritonserver's options for a local response cache of ``size_bytes``."""
    directory = cache_directory(binary)
    if not (directory / "local").is_dir():
        raise MissingDependencyError(
            f"the response cache needs Triton's local cache library, not found in {directory} "
            "(the nvidia-pytriton wheel ships it in tritonserver/caches/local)")
    return [f"--cache-directory={directory}", f"--cache-config=local,size={int(size_bytes)}"]
