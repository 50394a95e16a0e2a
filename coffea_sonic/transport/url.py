"""Parse model URLs in coffea's ``triton_wrapper`` form (``triton+grpc://host:port/model/version``).

``triton+grpcs://`` asks for TLS. The version is optional (absent = the latest the server has).

>>> ref = parse_model_url("triton+grpc://127.0.0.1:8001/jet_tagger/1")
>>> ref.address, ref.model, ref.version, ref.tls
('127.0.0.1:8001', 'jet_tagger', '1', False)
>>> parse_model_url("triton+grpcs://gpu.example.org/particlenet_lite").address
'gpu.example.org:8001'
>>> parse_model_url("http://x/jet_tagger")
Traceback (most recent call last):
...
coffea_sonic.errors.ConfigurationError: model URL 'http://x/jet_tagger' has scheme 'http'; use triton+grpc://host:port/model[/version] (or triton+grpcs:// for TLS)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigurationError

__all__ = ["DEFAULT_GRPC_PORT", "ModelRef", "parse_address", "parse_model_url"]

#: Triton's default gRPC port, used when a URL names none.
DEFAULT_GRPC_PORT = 8001
#: scheme -> whether it means TLS
SCHEMES: dict[str, bool] = {"triton+grpc": False, "triton+grpcs": True}
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

    @property
    def address(self) -> str:
        """``host:port`` as gRPC wants it (IPv6 hosts bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """The canonical URL again."""
        scheme = "triton+grpcs" if self.tls else "triton+grpc"
        tail = f"/{self.version}" if self.version else ""
        return f"{scheme}://{self.address}/{self.model}{tail}"


def parse_address(text: str, *, what: str = "server address") -> tuple[str, int]:
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
    return host, port if port is not None else DEFAULT_GRPC_PORT


def parse_model_url(url: str) -> ModelRef:
    """Parse ``triton+grpc[s]://host[:port]/model[/version]``; ``ConfigurationError`` if malformed.

    >>> parse_model_url("triton+grpc://[::1]:9000/emtrk_cnn/3").address
    '[::1]:9000'
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"model URL must be a string, got {type(url).__name__}")
    hint = "use triton+grpc://host:port/model[/version] (or triton+grpcs:// for TLS)"
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
            "(see coffea_sonic.transport.Secret), never in URLs")
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
    return ModelRef(host=parts.hostname, port=port if port is not None else DEFAULT_GRPC_PORT,
                    model=model, version=version, tls=SCHEMES[parts.scheme])
