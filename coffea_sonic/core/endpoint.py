"""The one model-URL parser and the one connection-settings type (docs/internals/core.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

from ..errors import ConfigurationError
from .secrets import Secret, header_fingerprint, normalize_headers, resolve_headers
from .settings import setting
from .tls import TlsOptions

__all__ = ["DEFAULT_GRPC_PORT", "DEFAULT_HTTP_PORT", "ModelRef", "ServerSettings", "configured_headers",
           "configured_protocol_key", "configured_tls", "join_address", "parse_address", "parse_model_url"]

#: Triton's default gRPC and HTTP ports, used when a URL names none.
DEFAULT_GRPC_PORT = 8001
DEFAULT_HTTP_PORT = 8000
#: scheme -> (protocol, whether it means TLS)
SCHEMES: dict[str, tuple[str, bool]] = {
    "triton+grpc": ("grpc", False), "triton+grpcs": ("grpc", True),
    "triton+http": ("http", False), "triton+https": ("http", True),
}
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class ModelRef:
    """One parsed model URL: where (``host:port``), what (model, version; ``""`` = latest), TLS.

    >>> ModelRef("h", 8001, "m", "", False).url
    'triton+grpc://h:8001/m'
    """

    host: str
    port: int
    model: str
    version: str
    tls: bool
    protocol: str = "grpc"

    @property
    def address(self) -> str:
        """``host:port`` as gRPC wants it (IPv6 hosts bracketed)."""
        return join_address(self.host, self.port)

    @property
    def url(self) -> str:
        """The canonical URL again."""
        scheme = f"triton+{self.protocol}{'s' if self.tls else ''}"
        tail = f"/{self.version}" if self.version else ""
        return f"{scheme}://{self.address}/{self.model}{tail}"


def join_address(host: str, port: int) -> str:
    """``host:port``, IPv6 hosts bracketed (the inverse of :func:`parse_address`).

    >>> join_address("::1", 9000), join_address("gpu1", 8001)
    ('[::1]:9000', 'gpu1:8001')
    """
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str, *, what: str = "server address",
                  default_port: int = DEFAULT_GRPC_PORT) -> tuple[str, int]:
    """Split ``host:port`` (or ``host``, ``[v6]:port``) into host and port.

    >>> parse_address("127.0.0.1:8001"), parse_address("[::1]:9000"), parse_address("node7")
    (('127.0.0.1', 8001), ('::1', 9000), ('node7', 8001))
    """
    try:
        parts = urlsplit(f"//{text.strip()}")
        host, port = parts.hostname, parts.port
    except ValueError as error:
        raise ConfigurationError(f"{what} {text!r} is not host:port ({error})") from None
    if not host or parts.path or parts.query or parts.username:
        raise ConfigurationError(f"{what} {text!r} is not host:port, e.g. 127.0.0.1:8001")
    return host, port if port is not None else default_port


def parse_model_url(url: str) -> ModelRef:
    """Parse ``triton+grpc[s]://host[:port]/model[/version]``; ``ConfigurationError`` if malformed.

    >>> parse_model_url("triton+grpc://[::1]:9000/emtrk_cnn/3").address
    '[::1]:9000'
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"model URL must be a string, got {type(url).__name__}")
    hint = ("use triton+grpc://host:port/model[/version] (triton+grpcs:// for TLS, "
            "triton+http[s]:// for Triton's HTTP API)")
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as error:
        raise ConfigurationError(f"model URL {url!r} is malformed ({error}); {hint}") from None
    if parts.scheme not in SCHEMES:
        raise ConfigurationError(f"model URL {url!r} has scheme {parts.scheme!r}; {hint}")
    if not parts.hostname:
        raise ConfigurationError(f"model URL {url!r} names no host; {hint}")
    if parts.username or parts.password:
        raise ConfigurationError(
            f"model URL {url!r} carries credentials; pass tokens as headers "
            "(see coffea_sonic.Secret), never in URLs")
    if parts.query or parts.fragment:
        raise ConfigurationError(f"model URL {url!r} has a query or fragment; {hint}")
    segments = [segment for segment in parts.path.split("/") if segment]
    if not 1 <= len(segments) <= 2:
        raise ConfigurationError(
            f"model URL {url!r} has path {parts.path!r}; expected /model or /model/version; {hint}")
    model = segments[0]
    version = segments[1] if len(segments) == 2 else ""
    if not _MODEL_NAME.match(model):
        raise ConfigurationError(f"model URL {url!r}: model name {model!r} has invalid characters")
    if version and not (version.isdigit() and int(version) > 0):
        raise ConfigurationError(
            f"model URL {url!r}: version {version!r} must be a positive integer "
            "(omit it for the latest version)")
    protocol, tls = SCHEMES[parts.scheme]
    default_port = DEFAULT_HTTP_PORT if protocol == "http" else DEFAULT_GRPC_PORT
    return ModelRef(host=parts.hostname, port=port if port is not None else default_port,
                    model=model, version=version, tls=tls, protocol=protocol)


ProtocolKey = tuple[str, "str | Secret"]


@dataclass(frozen=True)
class ServerSettings:
    """How to reach one server: address, protocol, TLS, headers, restricted-protocol key.

    ``protocol_key``: ``(KEY, value)`` of a server's ``--grpc-restricted-protocol`` (see
    docs/internals/core.md, "Server settings").

    >>> settings = ServerSettings("h:8001", headers=(("authorization", Secret("Bearer x")),),
    ...                           protocol_key=("k", Secret("v")))
    >>> settings
    ServerSettings('h:8001', grpc, headers=['authorization'], protocol_key='k')
    >>> [name for name, _ in settings.metadata()]
    ['authorization', 'triton-grpc-protocol-k']
    """

    address: str
    protocol: str = "grpc"
    tls: TlsOptions | None = None
    headers: tuple[tuple[str, "str | Secret"], ...] = ()
    protocol_key: ProtocolKey | None = None

    @classmethod
    def build(cls, address: str, *, protocol: str = "grpc", tls: TlsOptions | None = None,
              headers: Mapping[str, "str | Secret"] | None = None,
              protocol_key: "ProtocolKey | Mapping[str, str | Secret] | None" = None,
              ) -> "ServerSettings":
        """Settings with headers normalised (sensitive values wrapped) and the key checked."""
        if protocol not in ("grpc", "http"):
            raise ConfigurationError(f"protocol must be 'grpc' or 'http', not {protocol!r}")
        key = _coerce_protocol_key(protocol_key)
        return cls(address, protocol, tls, tuple(normalize_headers(headers).items()), key)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The headers as sent (secrets revealed, in this process only: never log this)."""
        resolved = resolve_headers(dict(self.headers))
        if self.protocol_key is not None:
            name, value = self.protocol_key
            header = f"triton-grpc-protocol-{name}" if self.protocol == "grpc" else name
            revealed = value.reveal() if isinstance(value, Secret) else value
            resolved += ((header.lower(), revealed),)
        return resolved

    @property
    def fingerprint(self) -> str:
        """A one-way digest of what is sent (keys per-process pools; reveals nothing)."""
        return header_fingerprint(dict(self.metadata())) if (self.headers or self.protocol_key) else ""

    def key(self) -> tuple[Any, ...]:
        """What identifies these settings in per-process caches (no secret values)."""
        pairs = [*self.headers] + ([self.protocol_key] if self.protocol_key is not None else [])
        sources = tuple(value.source for _, value in pairs if isinstance(value, Secret))
        return (self.address, self.protocol, self.tls.key() if self.tls else None,
                self.fingerprint, sources)

    def credential_source(self) -> str:
        """Where the ``authorization`` header comes from, never its value.

        >>> ServerSettings("h:8001").credential_source()
        'no token (no authorization header is sent)'
        >>> ServerSettings("h:8001", headers=(("authorization", Secret.from_env("T")),)
        ...                ).credential_source()
        'the token from env:T'
        """
        for name, value in self.headers:
            if name.lower() == "authorization":
                source = value.source if isinstance(value, Secret) else "literal"
                return ("a token given in code (headers=...)" if source == "literal"
                        else f"the token from {source}")
        return "no token (no authorization header is sent)"

    def __repr__(self) -> str:
        extras = [self.protocol]
        if self.tls is not None:
            extras.append("tls")
        if self.headers:
            extras.append(f"headers={sorted(name for name, _ in self.headers)}")
        if self.protocol_key is not None:
            extras.append(f"protocol_key={self.protocol_key[0]!r}")
        return f"ServerSettings({self.address!r}, {', '.join(extras)})"


def _coerce_protocol_key(value: Any) -> ProtocolKey | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        if len(value) != 1:
            raise ConfigurationError("protocol_key takes one KEY: value pair")
        value = next(iter(value.items()))
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)
            and value[0] and isinstance(value[1], (str, Secret))):
        raise ConfigurationError(
            "protocol_key must be ('KEY', value) with value a str or Secret, e.g. "
            "('triton-access-token', Secret.from_env('TRITON_KEY'))")
    name, secret = value
    return (name, secret if isinstance(secret, Secret) else Secret(secret))


def configured_tls() -> TlsOptions:
    """TLS options from the settings ``ca_file``, ``cert_file``, ``key_file``, ``server_name``
    (``COFFEA_SONIC_CA_FILE``..., Dask config, facility file); system roots when none is set."""
    return TlsOptions.coerce({
        "root_certificates": setting("ca_file"),
        "certificate_chain": setting("cert_file"),
        "private_key": setting("key_file"),
        "server_name": setting("server_name"),
    })


def configured_headers() -> dict[str, "str | Secret"]:
    """``authorization: Bearer <token>`` when the settings ``token_env`` (the NAME of the variable
    holding the token) or ``token_file`` are set; only the name or path is ever kept."""
    token_file = setting("token_file")
    if token_file:
        return {"authorization": Secret.from_file(token_file, prefix="Bearer ")}
    token_env = setting("token_env")
    if token_env:
        return {"authorization": Secret.bearer_from_env(str(token_env))}
    return {}


def configured_protocol_key() -> ProtocolKey | None:
    """The restricted-protocol key from the settings ``protocol_key_name`` and
    ``protocol_key_env`` (the NAME of the variable holding the value) or ``protocol_key_file``."""
    name = setting("protocol_key_name")
    if not name:
        return None
    key_file = setting("protocol_key_file")
    if key_file:
        return (str(name), Secret.from_file(key_file))
    key_env = setting("protocol_key_env")
    if not key_env:
        raise ConfigurationError(
            "protocol_key_name is set but neither protocol_key_env (the NAME of the variable "
            "holding the key) nor protocol_key_file is")
    return (str(name), Secret.from_env(str(key_env)))
