"""Where models are served and how to reach them: one place that reads every source of settings.

How, with an example: docs/internals/client.md; the sources of a model's URLs:
docs/facility/servers.md; the settings (:data:`SETTINGS`): docs/facility/settings.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Sequence

from .core.endpoint import DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT, parse_address, parse_model_url
from .core.settings import (DASK_PREFIX, ENV_PREFIX, SETTINGS, SOURCES, Resolved, Setting,
                            config_file, resolve, setting, spec)
from .core.settings import as_list as _as_list
from .core.settings import dask_setting as _dask_setting
from .core.settings import file_settings as _file_settings
from .errors import ConfigurationError

__all__ = ["DASK_PREFIX", "ENV_PREFIX", "SETTINGS", "SOURCES", "Resolved", "Setting", "config_file",
           "configured_models", "configured_servers", "effective_settings", "model_urls",
           "replace_server", "resolve", "resolve_model", "setting", "spec"]

logger = logging.getLogger(__name__)


def replace_server(url: str, server: str) -> str:
    """``url`` with its ``host:port`` replaced by ``server`` (scheme, model and version kept).

    Both are read by the one URL parser (:func:`coffea_sonic.core.endpoint.parse_model_url`,
    :func:`~coffea_sonic.core.endpoint.parse_address`); a ``server`` without a port gets the
    scheme's default one.

    >>> replace_server("triton+grpc://localhost:8001/jet_tagger/2", "gpu7:9001")
    'triton+grpc://gpu7:9001/jet_tagger/2'
    >>> replace_server("triton+https://localhost/jet_tagger", "[::1]")
    'triton+https://[::1]:8000/jet_tagger'
    >>> replace_server("grpc://localhost:8001/jet_tagger", "gpu7:9001")
    Traceback (most recent call last):
    ...
    coffea_sonic.errors.ConfigurationError: cannot put server 'gpu7:9001' into 'grpc://localhost:8001/jet_tagger': model URL 'grpc://localhost:8001/jet_tagger' has scheme 'grpc'; use triton+grpc://host:port/model[/version] (triton+grpcs:// for TLS, triton+http[s]:// for Triton's HTTP API)
    """
    try:
        ref = parse_model_url(url)
        host, port = parse_address(server, what="server", default_port=(
            DEFAULT_HTTP_PORT if ref.protocol == "http" else DEFAULT_GRPC_PORT))
    except ConfigurationError as error:
        raise ConfigurationError(f"cannot put server {server!r} into {url!r}: {error}") from None
    return dataclasses.replace(ref, host=host, port=port).url


def model_urls(name: str, declared: str | Sequence[str] | None = None) -> list[str]:
    """Every URL model ``name`` should be requested from, after run-time overrides.

    >>> model_urls("jet_tagger", "triton+grpc://localhost:8001/jet_tagger")
    ['triton+grpc://localhost:8001/jet_tagger']
    """
    resolved = resolve_model(name, declared)
    if not resolved.value:
        raise ConfigurationError(
            f"no server is configured for model {name!r}: declare a URL in the processor, or set "
            f"COFFEA_SONIC_MODEL_{name.upper()}, dask config {DASK_PREFIX}.models.{name}, or "
            f"[models] {name} in {config_file()}")
    return resolved.value


def resolve_model(name: str, declared: str | Sequence[str] | None = None) -> Resolved:
    """Model ``name``'s URLs and where they came from: ``COFFEA_SONIC_MODEL_<NAME>``, Dask config
    ``coffea_sonic.models.<name>``, the endpoints file's ``[models]``, the ``servers`` setting put
    into the declared URL, or the URL declared in code (source ``argument``); value ``[]`` if none.

    >>> resolve_model("jet_tagger", "triton+grpc://localhost:8001/jet_tagger").source
    'argument'
    """
    variable = f"{ENV_PREFIX}MODEL_{name.upper()}"
    env_urls = _as_list(os.environ.get(variable))
    if env_urls:
        return Resolved(f"models.{name}", env_urls, "environment", variable)
    dask_urls = _as_list(_dask_setting(f"models.{name}"))
    if dask_urls:
        return Resolved(f"models.{name}", dask_urls, "dask config", f"{DASK_PREFIX}.models.{name}")
    file_urls = _as_list(_file_settings().get("models", {}).get(name))
    if file_urls:
        return Resolved(f"models.{name}", file_urls, "endpoints file", f"{config_file()} [models]")
    declared_urls = _as_list(declared)
    servers = resolve("servers")
    if _as_list(servers.value) and declared_urls:
        urls = [replace_server(declared_urls[0], server) for server in _as_list(servers.value)]
        where = f"servers ({servers.where or servers.source}) in the declared URL"
        return Resolved(f"models.{name}", urls, servers.source, where)
    return Resolved(f"models.{name}", declared_urls, "argument" if declared_urls else "default",
                    "declared in code" if declared_urls else "")


def effective_settings(arguments: dict[str, object] | None = None) -> list[Resolved]:
    """Every documented setting (:data:`SETTINGS`) resolved, ``arguments`` taken as passed in code.

    >>> [entry.name for entry in effective_settings()][:3]
    ['config', 'servers', 'transport']
    """
    arguments = dict(arguments or {})
    for name in arguments:
        spec(name)  # an unknown name is an error that lists the known ones
    return [resolve(entry.name, arguments.get(entry.name)) for entry in SETTINGS]


def configured_models() -> dict[str, list[str]]:
    """Every model given an endpoint at run time (environment, Dask config, facility file).

    Sources are merged with the same precedence as :func:`model_urls` (environment first).

    >>> import os
    >>> os.environ["COFFEA_SONIC_MODEL_JET_TAGGER"] = "triton+grpc://gpu1:8001/jet_tagger"
    >>> configured_models()["jet_tagger"]
    ['triton+grpc://gpu1:8001/jet_tagger']
    >>> del os.environ["COFFEA_SONIC_MODEL_JET_TAGGER"]
    """
    models: dict[str, list[str]] = {}
    for name, urls in _file_settings().get("models", {}).items():
        models[name] = _as_list(urls)
    dask_models = _dask_setting("models")
    if isinstance(dask_models, dict):
        for name, urls in dask_models.items():
            models[name] = _as_list(urls)
    prefix = f"{ENV_PREFIX}MODEL_"
    for variable, urls in os.environ.items():
        if variable.startswith(prefix) and _as_list(urls):
            models[variable[len(prefix):].lower()] = _as_list(urls)
    return {name: urls for name, urls in sorted(models.items()) if urls}


def configured_servers() -> list[str]:
    """The ``host:port`` list that replaces declared servers (``COFFEA_SONIC_SERVERS`` etc.).

    >>> import os
    >>> os.environ["COFFEA_SONIC_SERVERS"] = "gpu1:8001, gpu2:8001"
    >>> configured_servers()
    ['gpu1:8001', 'gpu2:8001']
    >>> del os.environ["COFFEA_SONIC_SERVERS"]
    """
    return _as_list(resolve("servers").value)
