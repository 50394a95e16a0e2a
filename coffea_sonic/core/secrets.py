"""Secrets that never show in reprs, logs, errors or pickles (docs/internals/core.md)."""

from __future__ import annotations

import hashlib
import os
import secrets as _random
import threading
from pathlib import Path
from typing import Mapping

from ..errors import ConfigurationError

__all__ = ["SENSITIVE_HEADER_WORDS", "Secret", "header_fingerprint", "normalize_headers",
           "resolve_headers"]

#: Header names containing one of these words are treated as secret even when given as plain str.
SENSITIVE_HEADER_WORDS: tuple[str, ...] = (
    "authorization", "token", "key", "secret", "cookie", "password", "credential", "jwt")

# Literal secret values of this process, by random handle (inherited by forked children).
_LITERALS: dict[str, str] = {}
_LITERALS_LOCK = threading.Lock()


class Secret:
    """A secret string: redacted repr, never pickled in clear (docs/internals/core.md).

    >>> Secret.from_file("/run/token").__repr__()
    "Secret(file='/run/token')"
    """

    __slots__ = ("_value", "_env", "_file", "_prefix", "_handle")

    def __init__(self, value: str, *, prefix: str = "") -> None:
        if not isinstance(value, str):
            raise ConfigurationError("Secret value must be a str")
        self._value: str | None = value
        self._env: str | None = None
        self._file: str | None = None
        self._prefix = prefix
        self._handle = _random.token_hex(16)
        with _LITERALS_LOCK:
            _LITERALS[self._handle] = value

    @classmethod
    def from_env(cls, name: str, *, prefix: str = "") -> "Secret":
        """A secret read from environment variable ``name`` in whichever process uses it."""
        return _restore(name, None, prefix, "")

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, prefix: str = "") -> "Secret":
        """A secret read (stripped) from file ``path`` at each use (picks up refreshed tokens)."""
        return _restore(None, str(path), prefix, "")

    @classmethod
    def bearer_from_env(cls, name: str) -> "Secret":
        """``Authorization: Bearer $name`` — the usual JWT gateway header value.

        >>> Secret.bearer_from_env("SONIC_TOKEN")
        Secret(env='SONIC_TOKEN', prefix='Bearer ')
        """
        return cls.from_env(name, prefix="Bearer ")

    @property
    def source(self) -> str:
        """Where the value comes from, without the value: ``env:NAME``, ``file:PATH``, ``literal``."""
        if self._env is not None:
            return f"env:{self._env}"
        if self._file is not None:
            return f"file:{self._file}"
        return "literal"

    def reveal(self) -> str:
        """The secret's value (prefix included). Never log what this returns."""
        if self._env is not None:
            value = os.environ.get(self._env)
            if value is None:
                raise ConfigurationError(
                    f"environment variable {self._env} (holding a secret header value) is not set "
                    f"in this process (pid {os.getpid()}); set it here and on every Dask worker")
        elif self._file is not None:
            try:
                value = Path(self._file).read_text().strip()
            except OSError as error:
                raise ConfigurationError(
                    f"cannot read the secret file {self._file}: {error.strerror}") from None
        else:
            value = self._value if self._value is not None else _LITERALS.get(self._handle)
            if value is None:
                raise ConfigurationError(
                    "a literal secret (given as a plain string) was pickled and sent to a process "
                    f"(pid {os.getpid()}) that never had it; coffea-sonic never puts secret values "
                    "in pickles. Use Secret.from_env('NAME') (or Secret.bearer_from_env) and set "
                    "NAME on the workers, or Secret.from_file(path) on a shared filesystem")
        return self._prefix + value

    def fingerprint(self) -> str:
        """A short one-way digest of the value, to tell secrets apart without revealing them."""
        return hashlib.sha256(self.reveal().encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        prefix = f", prefix={self._prefix!r}" if self._prefix else ""
        if self._env is not None:
            return f"Secret(env={self._env!r}{prefix})"
        if self._file is not None:
            return f"Secret(file={self._file!r}{prefix})"
        return "Secret(<redacted>)"

    __str__ = __repr__

    def __reduce__(self):
        # a literal's value stays behind: only its handle travels
        return (_restore, (self._env, self._file, self._prefix, self._handle))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return (self._env, self._file, self._handle, self._prefix) == (
            other._env, other._file, other._handle, other._prefix)

    def __hash__(self) -> int:
        return hash((self._env, self._file, self._handle, self._prefix))


def _restore(env: str | None, file: str | None, prefix: str, handle: str) -> Secret:
    """A secret read from ``env`` or ``file``, else the literal of ``handle`` in this process."""
    secret = Secret.__new__(Secret)
    secret._value, secret._env, secret._file = None, env, file
    secret._prefix, secret._handle = prefix, handle
    return secret


def _is_sensitive(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in SENSITIVE_HEADER_WORDS)


def normalize_headers(headers: Mapping[str, str | Secret] | None) -> dict[str, str | Secret]:
    """Lower-case names (gRPC metadata keys must be) and wrap sensitive plain values in Secret.

    >>> normalize_headers({"Authorization": "Bearer x", "X-Client": "coffea"})
    {'authorization': Secret(<redacted>), 'x-client': 'coffea'}
    """
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise ConfigurationError(f"headers must be a mapping of name to value, got {type(headers).__name__}")
    normalized: dict[str, str | Secret] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not name or name != name.strip():
            raise ConfigurationError(f"header name {name!r} is not a valid gRPC metadata key")
        key = name.lower()
        if key.endswith("-bin"):
            raise ConfigurationError(f"binary header {key!r} is not supported; pass text values")
        if isinstance(value, Secret):
            normalized[key] = value
        elif isinstance(value, str):
            normalized[key] = Secret(value) if _is_sensitive(key) else value
        else:
            raise ConfigurationError(
                f"header {key!r} must be a str or Secret, got {type(value).__name__}")
    return normalized


def resolve_headers(headers: Mapping[str, str | Secret]) -> tuple[tuple[str, str], ...]:
    """gRPC metadata tuples with secrets revealed (for sending only; never log the result)."""
    return tuple((key, value.reveal() if isinstance(value, Secret) else value)
                 for key, value in headers.items())


def header_fingerprint(headers: Mapping[str, str | Secret]) -> str:
    """A one-way digest of the resolved headers (keys the per-process connection pool)."""
    digest = hashlib.sha256()
    for key, value in sorted(resolve_headers(headers)):
        digest.update(key.encode() + b"\0" + value.encode() + b"\0")
    return digest.hexdigest()[:16]
