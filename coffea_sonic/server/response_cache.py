"""Triton's response cache on the embedded server: one shared answer for identical requests.

How it works, with an example: docs/internals/server.md, "The response cache".
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
