"""Where models are served and how to reach them: one place that reads every source of settings.

A processor declares models by URL; at run time the same code can be pointed at another facility's
servers without edits. Sources, first match wins:

1. environment ``COFFEA_SONIC_MODEL_<NAME>`` (upper case; comma-separated URLs),
2. Dask config ``coffea_sonic.models.<name>`` (so ``dask.config.set`` or
   ``DASK_COFFEA_SONIC__MODELS__<NAME>`` reach every Dask worker),
3. the facility file (``$COFFEA_SONIC_CONFIG``, else ``~/.config/coffea-sonic/endpoints.toml``),
   table ``[models]``: ``jet_tagger = ["triton+grpc://gpu1:8001/jet_tagger", ...]``,
4. ``COFFEA_SONIC_SERVERS`` / ``coffea_sonic.servers`` / file key ``servers``: a list of
   ``host:port`` put in place of the declared URL's server (model name and version are kept),
5. the URL declared in code.

Other settings (``setting("fallback")`` …) follow the same order under their own names.

>>> import os
>>> os.environ["COFFEA_SONIC_SERVERS"] = "gpu1.example.org:8001,gpu2.example.org:8001"
>>> model_urls("jet_tagger", "triton+grpc://127.0.0.1:8001/jet_tagger/1")
['triton+grpc://gpu1.example.org:8001/jet_tagger/1', 'triton+grpc://gpu2.example.org:8001/jet_tagger/1']
>>> del os.environ["COFFEA_SONIC_SERVERS"]
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Sequence

from .errors import ConfigurationError

logger = logging.getLogger(__name__)

ENV_PREFIX = "COFFEA_SONIC_"
DASK_PREFIX = "coffea_sonic"
_URL_SERVER = re.compile(r"^(?P<scheme>triton\+(?:grpc|http)s?://)(?P<server>[^/]+)(?P<path>/.*)$")


def config_file() -> Path:
    """The facility endpoints file: ``$COFFEA_SONIC_CONFIG`` or ``~/.config/coffea-sonic/endpoints.toml``."""
    explicit = os.environ.get(ENV_PREFIX + "CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "coffea-sonic" / "endpoints.toml"


def _file_settings() -> dict[str, Any]:
    path = config_file()
    if not path.is_file():
        if os.environ.get(ENV_PREFIX + "CONFIG"):
            raise ConfigurationError(f"COFFEA_SONIC_CONFIG names {path}, which does not exist")
        return {}
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigurationError(f"{path} is not valid TOML: {error}") from error


def _dask_setting(key: str) -> Any:
    try:
        import dask.config
    except ImportError:  # pragma: no cover - dask is a dependency
        return None
    return dask.config.get(f"{DASK_PREFIX}.{key}", default=None)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return [str(part) for part in value]


def setting(name: str, default: Any = None) -> Any:
    """A setting from the environment (``COFFEA_SONIC_<NAME>``), Dask config, the file, or default.

    >>> setting("no_such_setting", 3)
    3
    """
    env_value = os.environ.get(ENV_PREFIX + name.upper())
    if env_value is not None:
        return env_value
    dask_value = _dask_setting(name)
    if dask_value is not None:
        return dask_value
    return _file_settings().get(name, default)


def replace_server(url: str, server: str) -> str:
    """``url`` with its ``host:port`` replaced by ``server``.

    >>> replace_server("triton+grpc://localhost:8001/jet_tagger/2", "gpu7:9001")
    'triton+grpc://gpu7:9001/jet_tagger/2'
    """
    match = _URL_SERVER.match(url)
    if not match:
        raise ConfigurationError(
            f"cannot put server {server!r} into {url!r}: expected triton+grpc://host:port/model[/version]")
    return f"{match['scheme']}{server}{match['path']}"


def model_urls(name: str, declared: str | Sequence[str] | None = None) -> list[str]:
    """Every URL model ``name`` should be requested from, after run-time overrides.

    >>> model_urls("jet_tagger", "triton+grpc://localhost:8001/jet_tagger")
    ['triton+grpc://localhost:8001/jet_tagger']
    """
    env_urls = _as_list(os.environ.get(f"{ENV_PREFIX}MODEL_{name.upper()}"))
    if env_urls:
        return env_urls
    dask_urls = _as_list(_dask_setting(f"models.{name}"))
    if dask_urls:
        return dask_urls
    file_settings = _file_settings()
    file_urls = _as_list(file_settings.get("models", {}).get(name))
    if file_urls:
        return file_urls
    declared_urls = _as_list(declared)
    servers = _as_list(os.environ.get(ENV_PREFIX + "SERVERS") or _dask_setting("servers")
                       or file_settings.get("servers"))
    if servers and declared_urls:
        return [replace_server(declared_urls[0], server) for server in servers]
    if not declared_urls:
        raise ConfigurationError(
            f"no server is configured for model {name!r}: declare a URL in the processor, or set "
            f"COFFEA_SONIC_MODEL_{name.upper()}, dask config {DASK_PREFIX}.models.{name}, or "
            f"[models] {name} in {config_file()}")
    return declared_urls


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
    return _as_list(os.environ.get(ENV_PREFIX + "SERVERS") or _dask_setting("servers")
                    or _file_settings().get("servers"))
