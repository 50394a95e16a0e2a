"""Every run-time setting, its sources and where a value came from (docs/facility/settings.md)."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError

__all__ = ["DASK_PREFIX", "ENV_PREFIX", "SETTINGS", "SOURCES", "Resolved", "Setting", "as_list",
           "config_file", "dask_setting", "file_settings", "resolve", "setting", "spec"]

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


#: Where a value can come from, highest precedence first.
SOURCES: tuple[str, ...] = ("argument", "environment", "dask config", "endpoints file", "default")


@dataclass(frozen=True)
class Setting:
    """One documented setting: its name, default, meaning, and the sources it is read from."""

    name: str
    default: Any
    help: str
    sources: tuple[str, ...] = SOURCES
    #: computes the default when it depends on the machine (paths under $HOME)
    default_factory: Callable[[], Any] | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def dask_key(self) -> str:
        return f"{DASK_PREFIX}.{self.name}"

    def default_value(self) -> Any:
        return self.default_factory() if self.default_factory else self.default


@dataclass(frozen=True)
class Resolved:
    """A setting's effective value, its source (one of :data:`SOURCES`) and where exactly
    (the variable, the Dask key, the file)."""

    name: str
    value: Any
    source: str
    where: str = ""


def _default_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "coffea-sonic")


_ENV_ONLY = ("argument", "environment", "default")
SETTINGS: tuple[Setting, ...] = (
    Setting("config", None, "the endpoints file (TOML: [models], servers, any setting below)",
            sources=_ENV_ONLY, default_factory=lambda: str(config_file())),
    Setting("servers", None, "host:port list put in place of every declared URL's server"),
    Setting("transport", "auto", "auto, grpc, shm, cuda or http: how TritonModel sends tensors"),
    Setting("fallback", "off", "off, local or cpu: where inference goes when every server fails"),
    Setting("shadow", 0.0, "fraction of served rows recomputed in-process and compared (0: off)"),
    Setting("shadow_dir", None, "folder where shadow validation's reports go (monitor --shadow)"),
    Setting("fallback_repository", None,
            "Triton repository that fallback='local' serves (fallback='cpu': its tree models)"),
    Setting("connect_timeout_s", 10.0, "seconds a server gets to answer at all before it counts "
            "as down (and the fallback, if set, answers)"),
    Setting("nonfinite", "warn", "pass, warn or raise: NaN/inf in inputs sent as given, warned "
            "about once per model and tensor, or refused"),
    Setting("preflight", "on", "on or off: check a processor's models against the servers "
            "before processor.Runner starts its chunks"),
    Setting("report_dir", None, "folder of run reports and their journals (default "
            "<cache>/runs)"),
    Setting("ca_file", None, "PEM bundle of the CA(s) to trust for triton+grpcs:// servers"),
    Setting("cert_file", None, "client certificate for mutual TLS"),
    Setting("key_file", None, "client private key for mutual TLS"),
    Setting("server_name", None, "name to verify the server certificate against (tunnels)"),
    Setting("token_env", None, "name of the variable holding the bearer token (never its value)"),
    Setting("token_file", None, "file holding the bearer token"),
    Setting("protocol_key_name", None, "key of a server's --grpc-restricted-protocol"),
    Setting("protocol_key_env", None, "variable holding that key's value"),
    Setting("protocol_key_file", None, "file holding that key's value"),
    Setting("inference_cache", None, "directory of the persistent inference cache (off when unset)"),
    Setting("inference_cache_size", 20 * 10**9, "size limit of that cache (bytes or e.g. 20GiB)"),
    Setting("cache", None, "where generated zoo models and downloaded tools are kept",
            sources=_ENV_ONLY, default_factory=_default_cache),
    Setting("perf_analyzer", None, "folder holding NVIDIA's perf_analyzer (bench reference)",
            sources=_ENV_ONLY),
    Setting("malloc_tuning", "1", "0 leaves glibc's malloc thresholds alone in gRPC clients",
            sources=_ENV_ONLY),
    Setting("compression", "none", "none, gzip or deflate: requests compressed over gRPC and HTTP "
            "(pays only on slow links: benchmarks/RESULTS.md)"),
    Setting("grpc_connections", None, "gRPC connections per server and process (default: the "
            "transport's)", sources=_ENV_ONLY),
    Setting("server_env", None, "an existing environment (venv or conda prefix) the embedded "
            "server runs from", sources=_ENV_ONLY),
    Setting("server_python", None, "the Python (3.8-3.12) that `coffea-sonic server install` "
            "builds the server's environment with", sources=_ENV_ONLY),
)
_BY_NAME: Mapping[str, Setting] = {entry.name: entry for entry in SETTINGS}


def spec(name: str) -> Setting:
    """The documented :class:`Setting` called ``name``; a ConfigurationError lists the names.

    >>> spec("transport").env
    'COFFEA_SONIC_TRANSPORT'
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigurationError(f"no setting named {name!r}; the settings are "
                                 f"{', '.join(_BY_NAME)}") from None


_UNSET: Any = object()


def resolve(name: str, argument: Any = None, *, default: Any = _UNSET) -> Resolved:
    """Setting ``name``'s value and source, in the order of :data:`SOURCES`.

    ``argument``: what the code passed (None: not passed). ``default`` overrides the documented
    default. An undocumented name is read the same way (all sources).

    >>> resolve("transport", "grpc")
    Resolved(name='transport', value='grpc', source='argument', where='')
    """
    entry = _BY_NAME.get(name) or Setting(name, None, "")
    if argument is not None:
        return Resolved(name, argument, "argument")
    env_value = os.environ.get(entry.env)
    if env_value is not None:
        return Resolved(name, env_value, "environment", entry.env)
    if "dask config" in entry.sources:
        dask_value = dask_setting(name)
        if dask_value is not None:
            return Resolved(name, dask_value, "dask config", entry.dask_key)
    if "endpoints file" in entry.sources:
        file_value = file_settings().get(name)
        if file_value is not None:
            return Resolved(name, file_value, "endpoints file", str(config_file()))
    return Resolved(name, entry.default_value() if default is _UNSET else default, "default")


def setting(name: str, default: Any = _UNSET) -> Any:
    """Setting ``name``'s value (see :func:`resolve`); ``default``, if given, instead of the
    documented default when no source sets it."""
    return resolve(name, default=default).value
