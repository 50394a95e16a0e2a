"""The sources of run-time settings, first match wins: environment, Dask config, facility file.

1. environment ``COFFEA_SONIC_<NAME>``,
2. Dask config ``coffea_sonic.<name>`` (so ``dask.config.set`` or ``DASK_COFFEA_SONIC__<NAME>``
   reach every Dask worker),
3. the facility file (``$COFFEA_SONIC_CONFIG``, else ``~/.config/coffea-sonic/endpoints.toml``).

Here, below :mod:`.endpoint` (whose ``configured_*`` settings read them), so that
:mod:`coffea_sonic.config` (model endpoints, server overrides) can parse URLs with
:mod:`.endpoint` without an import cycle. Use them through :mod:`coffea_sonic.config`.

>>> setting("no_such_setting", 3)
3
>>> as_list("gpu1:8001, gpu2:8001"), as_list(None)
(['gpu1:8001', 'gpu2:8001'], [])
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError

__all__ = ["DASK_PREFIX", "ENV_PREFIX", "as_list", "config_file", "dask_setting", "file_settings",
           "setting"]

ENV_PREFIX = "COFFEA_SONIC_"
DASK_PREFIX = "coffea_sonic"


def config_file() -> Path:
    """The facility endpoints file: ``$COFFEA_SONIC_CONFIG`` or ``~/.config/coffea-sonic/endpoints.toml``."""
    explicit = os.environ.get(ENV_PREFIX + "CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "coffea-sonic" / "endpoints.toml"


def file_settings() -> dict[str, Any]:
    """The facility file's tables (empty without one; an explicitly named one must exist)."""
    path = config_file()
    if not path.is_file():
        if os.environ.get(ENV_PREFIX + "CONFIG"):
            raise ConfigurationError(f"COFFEA_SONIC_CONFIG names {path}, which does not exist")
        return {}
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigurationError(f"{path} is not valid TOML: {error}") from error


def dask_setting(key: str) -> Any:
    """``coffea_sonic.<key>`` from Dask's config, None if unset."""
    try:
        import dask.config
    except ImportError:  # pragma: no cover - dask is a dependency
        return None
    return dask.config.get(f"{DASK_PREFIX}.{key}", default=None)


def as_list(value: Any) -> list[str]:
    """A comma-separated string or a sequence as a list of non-empty strings."""
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return [str(part) for part in value]


def setting(name: str, default: Any = None) -> Any:
    """A setting from the environment (``COFFEA_SONIC_<NAME>``), Dask config, the file, or default."""
    env_value = os.environ.get(ENV_PREFIX + name.upper())
    if env_value is not None:
        return env_value
    dask_value = dask_setting(name)
    if dask_value is not None:
        return dask_value
    return file_settings().get(name, default)
