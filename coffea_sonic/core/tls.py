"""TLS settings of the gRPC and HTTP transports, picklable by path (docs/internals/core.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import ConfigurationError
from .secrets import Secret

__all__ = ["TlsOptions"]


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ConfigurationError(f"cannot read TLS {what} {path}: {error.strerror}") from None


@dataclass(frozen=True)
class TlsOptions:
    """Server verification and optional client (mutual TLS) identity.

    ``root_certificates``: PEM bundle of the CA(s) to trust (None: the system's roots).
    ``certificate_chain`` / ``private_key``: the client's certificate and key for mutual TLS.
    ``server_name``: verify the server's certificate against this name instead of the URL's host.

    >>> TlsOptions(server_name="triton.cern.ch").key()[-1]
    'triton.cern.ch'
    """

    root_certificates: str | None = None
    certificate_chain: str | None = None
    private_key: str | Secret | None = None
    server_name: str | None = None

    @classmethod
    def coerce(cls, value: "TlsOptions | Mapping[str, Any] | bool | None") -> "TlsOptions | None":
        """Accept ``None``/``False`` (no TLS), ``True`` (system roots), a mapping, or options."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, TlsOptions):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"root_certificates", "certificate_chain",
                                           "private_key", "server_name"})
            if unknown:
                raise ConfigurationError(
                    f"unknown TLS option(s) {unknown}; known: root_certificates, "
                    "certificate_chain, private_key, server_name")
            return cls(**{key: (os.fspath(item) if isinstance(item, os.PathLike) else item)
                          for key, item in value.items()})
        raise ConfigurationError(
            f"ssl must be None, a bool, a mapping or TlsOptions, not {type(value).__name__}")

    def __post_init__(self) -> None:
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ConfigurationError(
                "mutual TLS needs both certificate_chain and private_key (got only one)")

    def key(self) -> tuple[str | None, ...]:
        """What identifies these settings in the connection pool (no secret values)."""
        private = self.private_key
        private_id = private.source if isinstance(private, Secret) else private
        return (self.root_certificates, self.certificate_chain, private_id, self.server_name)

    def credentials(self):
        """``grpc.ChannelCredentials`` built from the files (read now, in this process)."""
        import grpc

        root = _read(self.root_certificates, "root certificates") if self.root_certificates else None
        chain = _read(self.certificate_chain, "certificate chain") if self.certificate_chain else None
        key: bytes | None = None
        if isinstance(self.private_key, Secret):
            key = self.private_key.reveal().encode()
        elif self.private_key is not None:
            key = _read(self.private_key, "private key")
        return grpc.ssl_channel_credentials(root_certificates=root, private_key=key,
                                            certificate_chain=chain)

    def channel_options(self) -> list[tuple[str, Any]]:
        """Extra channel arguments (the server-name override)."""
        if self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name),
                    ("grpc.default_authority", self.server_name)]
        return []
