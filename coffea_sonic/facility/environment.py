"""What Dask workers must know about the model servers, and how it reaches them without leaking secrets.

How it works, with examples: docs/internals/facility.md, "Settings on batch workers".
"""

from __future__ import annotations

import logging
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from ..config import DASK_PREFIX, ENV_PREFIX, setting
from ..errors import ConfigurationError

logger = logging.getLogger(__name__)

__all__ = ["EnvironmentPlugin", "WorkerEnvironment", "is_secret_name", "worker_environment"]

#: A variable whose name contains one of these words is treated as a secret: forwarded by name only.
SECRET_NAME_WORDS: tuple[str, ...] = (
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH", "COOKIE", "JWT")
_REFERENCE_SUFFIXES = ("_ENV", "_FILE", "_PATH")
_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_secret_name(name: str) -> bool:
    """Whether a variable called ``name`` is treated as holding a secret.

    Names that end in ``_ENV``, ``_FILE`` or ``_PATH`` hold a variable name or a path, not the
    secret itself, and are plain settings.

    >>> is_secret_name("SONIC_TOKEN"), is_secret_name("COFFEA_SONIC_SERVERS")
    (True, False)
    >>> is_secret_name("COFFEA_SONIC_TOKEN_ENV"), is_secret_name("COFFEA_SONIC_TOKEN_FILE")
    (False, False)
    """
    upper = name.upper()
    if upper.endswith(_REFERENCE_SUFFIXES):
        return False
    return any(word in upper for word in SECRET_NAME_WORDS)


def _check_name(name: str) -> str:
    if not _VARIABLE_NAME.match(name):
        raise ConfigurationError(
            f"{name!r} is not an environment variable name (letters, digits and _ only)")
    return name


def _dask_settings_as_env() -> dict[str, str]:
    """The ``coffea_sonic`` Dask config as ``DASK_COFFEA_SONIC__...`` variables Dask reads back."""
    import dask.config

    subtree = dask.config.get(DASK_PREFIX, default=None)
    if not isinstance(subtree, Mapping):
        return {}
    flat: dict[str, str] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, Mapping):
            for key, child in node.items():
                walk(f"{prefix}__{str(key).upper().replace('-', '_')}", child)
        else:
            # dask parses these values with ast.literal_eval, so lists and numbers survive
            flat[prefix] = repr(node) if not isinstance(node, str) else node

    walk("DASK_" + DASK_PREFIX.upper(), subtree)
    return flat


@dataclass(frozen=True)
class WorkerEnvironment:
    """Settings for Dask workers: plain ``values`` and secret names that are ``forwarded`` only.

    >>> WorkerEnvironment({"A": "1"}, ("B_TOKEN",)).names()
    ['A', 'B_TOKEN']
    """

    values: Mapping[str, str] = field(default_factory=dict)
    forwarded: tuple[str, ...] = ()

    def names(self) -> list[str]:
        """Every variable name the workers get (values and forwarded)."""
        return sorted(set(self.values) | set(self.forwarded))

    def missing_here(self) -> list[str]:
        """Forwarded names that are not set in this (submitting) process: the jobs would lack them."""
        return [name for name in self.forwarded if not os.environ.get(name)]

    def slurm_prologue(self) -> list[str]:
        """Job-script lines: ``export`` for values; for forwarded names only a check that names them."""
        lines = [f"export {name}={shlex.quote(value)}" for name, value in sorted(self.values.items())]
        for name in self.forwarded:
            # The value arrives through sbatch --export=ALL; the script must not contain it.
            lines.append(
                f'[ -n "${{{name}:-}}" ] || echo \'coffea-sonic: {name} is not set in this job; '
                f"export it in the environment you submit from' >&2")
        return lines

    def htcondor_environment(self) -> str:
        """The submit file's ``environment`` value; forwarded names become ``$ENV(NAME)``.

        condor_submit expands ``$ENV(NAME)`` from the submitting environment, so the submit
        description holds only the name.
        """
        def quoted(value: str) -> str:
            # HTCondor "new" syntax: ' groups a value, '' is a literal ', "" a literal "
            return "'" + value.replace("'", "''").replace('"', '""') + "'"

        parts = [f"{name}={quoted(value)}" for name, value in sorted(self.values.items())]
        parts += [f"{name}='$ENV({name})'" for name in self.forwarded]
        return '"' + " ".join(parts) + '"'

    def plugin(self) -> "EnvironmentPlugin":
        """A Dask worker plugin that sets the values (never the secrets) on already running workers."""
        return EnvironmentPlugin(dict(self.values), tuple(self.forwarded))


def worker_environment(env: Mapping[str, str] | Iterable[str] | None = None, *,
                       include_settings: bool = True) -> WorkerEnvironment:
    """Collect what workers need: coffea-sonic settings of this process plus ``env``.

    ``env`` is a mapping of plain variables to set on workers, or an iterable of variable names to
    forward by name from the submitting environment (a token: ``env=["SONIC_TOKEN"]``). A mapping
    entry whose name looks secret is refused: a secret's value must never be written into a job.
    With ``include_settings``, every ``COFFEA_SONIC_*`` variable (secret-looking ones by name), the
    variable named by ``COFFEA_SONIC_TOKEN_ENV``, and the ``coffea_sonic`` Dask config are included.

    >>> import os
    >>> os.environ["COFFEA_SONIC_MODEL_JET_TAGGER"] = "triton+grpc://gpu1:8001/jet_tagger"
    >>> env = worker_environment(["SONIC_TOKEN"])
    >>> env.values["COFFEA_SONIC_MODEL_JET_TAGGER"], env.forwarded
    ('triton+grpc://gpu1:8001/jet_tagger', ('SONIC_TOKEN',))
    >>> del os.environ["COFFEA_SONIC_MODEL_JET_TAGGER"]
    >>> worker_environment({"SONIC_TOKEN": "abc"})
    Traceback (most recent call last):
    ...
    coffea_sonic.errors.ConfigurationError: SONIC_TOKEN looks like a secret; its value must not be written into batch jobs. Export SONIC_TOKEN in the environment you submit from and pass its name only: env=['SONIC_TOKEN']
    """
    values: dict[str, str] = {}
    forwarded: list[str] = []

    def forward(name: str) -> None:
        if _check_name(name) not in forwarded:
            forwarded.append(name)

    if include_settings:
        for name, value in sorted(os.environ.items()):
            if not name.startswith(ENV_PREFIX):
                continue
            if is_secret_name(name[len(ENV_PREFIX):]):
                forward(name)
            else:
                values[name] = value
        # the token variable named by the token_env setting (any source) travels by name
        token_variable = setting("token_env")
        if token_variable:
            forward(token_variable)
        values.update(_dask_settings_as_env())
    if isinstance(env, Mapping):
        for name, value in env.items():
            _check_name(name)
            if is_secret_name(name):
                raise ConfigurationError(
                    f"{name} looks like a secret; its value must not be written into batch jobs. "
                    f"Export {name} in the environment you submit from and pass its name only: "
                    f"env=[{name!r}]")
            values[name] = str(value)
    elif env is not None:
        if isinstance(env, str):
            env = [env]
        for name in env:
            forward(name)
    for name in forwarded:
        values.pop(name, None)
    return WorkerEnvironment(values=values, forwarded=tuple(forwarded))


class EnvironmentPlugin(WorkerPlugin):
    """Dask worker plugin: sets plain settings on workers we did not start (a scheduler address).

    Secrets are not sent over Dask; forwarded names missing on a worker are logged there, by name.

    >>> plugin = EnvironmentPlugin({"COFFEA_SONIC_SERVERS": "gpu1:8001"}, ("SONIC_TOKEN",))
    >>> plugin.name
    'coffea-sonic-environment'
    """

    name = "coffea-sonic-environment"

    def __init__(self, values: Mapping[str, str], forwarded: Iterable[str] = ()) -> None:
        self.values = dict(values)
        self.forwarded = tuple(forwarded)

    def setup(self, worker: Any) -> None:
        os.environ.update(self.values)
        dask_values = {key: value for key, value in self.values.items() if key.startswith("DASK_")}
        if dask_values:
            import dask.config

            # Workers read DASK_* only at start-up: merge the new variables into their config.
            dask.config.update(dask.config.config, dask.config.collect_env(dask_values),
                               priority="new")
        missing = [name for name in self.forwarded if not os.environ.get(name)]
        if missing:
            logger.warning("coffea-sonic: %s not set on worker %s; the facility must provide it",
                           ", ".join(missing), getattr(worker, "address", "?"))

