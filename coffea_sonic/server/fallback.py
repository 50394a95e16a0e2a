"""The engine of ``fallback="local"``: an embedded Triton server with the model, per process.

How it works, with an example: docs/internals/server.md, "The local fallback".
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..core.process_local import ProcessLocal

__all__ = ["declared_info", "local_fallback_engine"]

logger = logging.getLogger("coffea_sonic.fallback")

#: this process' fallback servers per repository (a forked child never stops its parent's)
_servers: ProcessLocal[Path, object] = ProcessLocal("fallback servers")


def fallback_repository() -> Path | None:
    """The repository that ``fallback="local"`` serves models from (setting), or None (the zoo)."""
    from ..config import setting

    value = setting("fallback_repository")
    return Path(str(value)).expanduser().resolve() if value else None


def _repository_server(repository: Path):
    from .launcher import LocalTritonServer

    with _servers.lock:
        server = _servers.peek(repository)
        if server is None or not server.running:
            server = LocalTritonServer(repository=repository, device="cpu",
                                       skip_unservable=True).start()
            _servers.set(repository, server)
            logger.warning("coffea-sonic: started a local fallback Triton server for repository "
                           "%s at %s%s", repository, server.grpc_address,
                           f" (skipped: {server.skipped})" if server.skipped else "")
        return server


def local_fallback_engine(model: str, version: str = ""):
    """A TritonModel of ``model`` (``version`` of it, if given) on a LocalTritonServer started
    here (kept alive with it)."""
    from .. import zoo
    from ..errors import ConfigurationError
    from ..model import TritonModel
    from ..zoo.trees import tree_names
    from .launcher import LocalTritonServer

    repository = fallback_repository()
    if repository is not None:
        server = _repository_server(repository)
        skipped = [entry for entry in server.skipped if entry[0] == model]
        if skipped or not (server.served_repository / model).is_dir():
            why = f": {skipped[0][2]}" if skipped else ""
            raise ConfigurationError(
                f"fallback='local' cannot serve {model!r} from repository {repository}{why}; "
                f"check it with `coffea-sonic models validate {repository}`")
    elif model in zoo.names() or model in tree_names():
        server = LocalTritonServer(models=[model], device="cpu").start()
        logger.warning("coffea-sonic: started a local fallback Triton server for %s at %s",
                       model, server.grpc_address)
    else:
        raise ConfigurationError(
            f"fallback='local' serves zoo models, and {model!r} is not one; set "
            "COFFEA_SONIC_FALLBACK_REPOSITORY (setting fallback_repository) to the Triton "
            "repository that holds it")
    client = TritonModel(server.url(model, version or None), fallback="off")
    client._fallback_server = server  # keeps the server alive as long as the engine
    return client


def declared_info(model: str):
    """What ``model`` declares for ``fallback="local"``: the zoo's declaration, or, with a
    fallback repository, what the local server serving it declares (starting it)."""
    from .. import fallback as fallback_module
    from .. import zoo
    from ..zoo.trees import declared_tree_info

    if fallback_repository() is None:
        return zoo.declared_info(model) or declared_tree_info(model)
    return fallback_module.fallback_engine("local", model).info
