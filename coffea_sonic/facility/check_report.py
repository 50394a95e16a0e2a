"""What ``coffea-sonic check`` checks and what it found: targets, options, findings, the text.

How targets are parsed, with an example: docs/internals/facility.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..config import setting
from ..core.endpoint import (DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT, SCHEMES, ProtocolKey,
                             ServerSettings, configured_headers, configured_protocol_key,
                             configured_tls, join_address, parse_address, parse_model_url)
from ..core.secrets import Secret
from ..core.tls import TlsOptions
from ..errors import ConfigurationError

__all__ = ["CheckOptions", "DEFAULT_PORTS", "Finding", "ServedModel", "ServerReport", "Status",
           "Target", "parse_target", "render_report", "render_reports"]

Status = Literal["ok", "warn", "fail"]
#: Triton's default ports, quoted in advice.
DEFAULT_PORTS = {"grpc": DEFAULT_GRPC_PORT, "http": DEFAULT_HTTP_PORT, "metrics": 8002}
#: Short scheme names accepted for convenience (``grpc://h/m`` = ``triton+grpc://h/m``).
_SCHEME_ALIASES = {"grpc": "triton+grpc", "grpcs": "triton+grpcs"}
#: What the model of a target without one is called when settings are built for it (no request
#: ever names it).
NO_MODEL = "_coffea_sonic_check_"


@dataclass(frozen=True)
class Target:
    """One server to check, optionally with the model (and version) that must be there.

    ``tls`` None: the target did not say (bare ``host:port``); ``protocol``: ``"grpc"`` or
    ``"http"`` (Triton's HTTP API, ``triton+http://``).

    >>> parse_target("127.0.0.1:8001")
    Target(host='127.0.0.1', port=8001, tls=None, model='', version='', protocol='grpc')
    """

    host: str
    port: int
    tls: bool | None = None
    model: str = ""
    version: str = ""
    protocol: str = "grpc"

    @property
    def address(self) -> str:
        """``host:port`` (IPv6 hosts bracketed), as the transports dial it."""
        return join_address(self.host, self.port)

    @property
    def label(self) -> str:
        """The target as given back in reports."""
        if self.tls is None:
            scheme = ""
        else:
            scheme = f"triton+{self.protocol}{'s' if self.tls else ''}://"
        path = f"/{self.model}" + (f"/{self.version}" if self.version else "") if self.model else ""
        return f"{scheme}{self.address}{path}"

    def settings(self) -> ServerSettings:
        """How a worker reaches this server: the configured TLS (``...s://`` targets), token and
        restricted-protocol key, as :class:`~coffea_sonic.model.TritonModel` builds them.

        >>> parse_target("triton+http://gpu1/m").settings()
        ServerSettings('gpu1:8000', http)
        """
        return ServerSettings.build(self.address, protocol=self.protocol,
                                    tls=configured_tls() if self.tls else None,
                                    headers=configured_headers(),
                                    protocol_key=configured_protocol_key())

    def model_url(self, tls: bool | None = None) -> str:
        """The ``triton+...://`` URL a TritonModel for this target is given (``tls`` overrides)."""
        secure = self.tls if tls is None else tls
        model = self.model or NO_MODEL
        tail = f"/{self.version}" if self.version and self.model else ""
        return f"triton+{self.protocol}{'s' if secure else ''}://{self.address}/{model}{tail}"


def parse_target(text: str) -> Target:
    """``host[:port]`` or a model URL ``triton+grpc[s]://host[:port][/model[/version]]``
    (``triton+http[s]://`` for Triton's HTTP API; ``grpc[s]://`` is accepted for gRPC).

    >>> parse_target("grpc://h:9001/m/3") == parse_target("triton+grpc://h:9001/m/3")
    True
    >>> parse_target("triton+http://gpu1").address
    'gpu1:8000'
    >>> parse_target("http://127.0.0.1:8000")
    Traceback (most recent call last):
    ...
    coffea_sonic.errors.ConfigurationError: 'http://127.0.0.1:8000' is not a Triton model URL: check talks to Triton as the workers do, so give triton+grpc://host:port/model (gRPC, port 8001 by default) or triton+http://host:port/model (Triton's HTTP API, port 8000)
    """
    stripped = text.strip()
    scheme, separator, rest = stripped.partition("://")
    if not separator:
        host, port = parse_address(stripped, what="server", default_port=DEFAULT_PORTS["grpc"])
        return Target(host=host, port=port)
    scheme = _SCHEME_ALIASES.get(scheme.lower(), scheme.lower())
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"{text!r} is not a Triton model URL: check talks to Triton as the workers do, so give "
            f"triton+grpc://host:port/model (gRPC, port {DEFAULT_PORTS['grpc']} by default) or "
            f"triton+http://host:port/model (Triton's HTTP API, port {DEFAULT_PORTS['http']})")
    server, _, path = rest.partition("/")
    if path.strip("/"):
        ref = parse_model_url(f"{scheme}://{rest}")
        return Target(ref.host, ref.port, ref.tls, ref.model, ref.version, ref.protocol)
    protocol, tls = SCHEMES[scheme]
    host, port = parse_address(server, what="server", default_port=DEFAULT_PORTS[protocol])
    return Target(host=host, port=port, tls=tls, protocol=protocol)


@dataclass(frozen=True)
class CheckOptions:
    """How to reach the servers: None everywhere means "as the workers are configured".

    Unset options fall back to the settings the workers read (``COFFEA_SONIC_CA_FILE``,
    ``COFFEA_SONIC_TOKEN_ENV``, ``COFFEA_SONIC_PROTOCOL_KEY_NAME``..., Dask config, the facility
    file), through the same helpers as :class:`~coffea_sonic.model.TritonModel`. Secrets are
    given by variable name or file, never by value.

    ``tls``: None = as the URL says; ``ca_file``/``cert_file``/``key_file``/``server_name``: CA
    bundle, client identity (mutual TLS), name to verify (tunnels). ``token_env``/``token_file``:
    where the bearer token is read. ``protocol_key_name`` + ``protocol_key_env`` /
    ``protocol_key_file``: the key of a server that restricts protocol groups
    (``--grpc-restricted-protocol=...:KEY=VALUE``). ``transport``: what the workers ask for
    (``"auto"``, ``"grpc"``, ``"shm"``, ``"http"``; None: their ``transport`` setting, default
    ``"auto"``).

    >>> CheckOptions(token_env="SONIC_TOKEN").token_source
    '$SONIC_TOKEN'
    >>> CheckOptions(token_env="SONIC_TOKEN").headers()
    {'authorization': Secret(env='SONIC_TOKEN', prefix='Bearer ')}
    >>> CheckOptions(protocol_key_name="k", protocol_key_env="K").protocol_key()
    ('k', Secret(env='K'))
    """

    tls: bool | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    token_env: str | None = None
    token_file: str | None = None
    timeout_s: float = 5.0
    pings: int = 5
    protocol_key_name: str | None = None
    protocol_key_env: str | None = None
    protocol_key_file: str | None = None
    transport: str | None = None

    @property
    def token_source(self) -> str | None:
        """Where the token comes from (``$NAME`` or a path), never its value."""
        if self.token_file:
            return self.token_file
        if self.token_env:
            return f"${self.token_env}"
        configured_file = setting("token_file")
        if configured_file:
            return str(configured_file)
        name = setting("token_env")
        return f"${name}" if name else None

    def headers(self) -> dict[str, Secret] | None:
        """Headers given here; None: the workers' configured ones (``configured_headers``)."""
        if self.token_file:
            return {"authorization": Secret.from_file(self.token_file, prefix="Bearer ")}
        if self.token_env:
            return {"authorization": Secret.bearer_from_env(self.token_env)}
        return None

    def protocol_key(self) -> ProtocolKey | None:
        """The restricted-protocol key given here; None: the workers' configured one."""
        if not self.protocol_key_name:
            if self.protocol_key_env or self.protocol_key_file:
                raise ConfigurationError(
                    "--protocol-key-env/--protocol-key-file need --protocol-key-name KEY (the "
                    "KEY of the server's --grpc-restricted-protocol=GROUPS:KEY=VALUE)")
            return None
        if self.protocol_key_file:
            return (self.protocol_key_name, Secret.from_file(self.protocol_key_file))
        if not self.protocol_key_env:
            raise ConfigurationError(
                "--protocol-key-name needs --protocol-key-env NAME (the variable holding the key) "
                "or --protocol-key-file PATH")
        return (self.protocol_key_name, Secret.from_env(self.protocol_key_env))

    def tls_options(self) -> TlsOptions | None:
        """TLS options given here; None: the workers' configured ones (``configured_tls``)."""
        if not (self.ca_file or self.cert_file or self.key_file or self.server_name):
            return None
        return TlsOptions(root_certificates=self.ca_file, certificate_chain=self.cert_file,
                          private_key=self.key_file, server_name=self.server_name)


@dataclass(frozen=True)
class Finding:
    """One line of a report: what was checked, ok/warn/fail, what was seen, what to do."""

    aspect: str
    status: Status
    summary: str
    advice: str = ""


@dataclass(frozen=True)
class ServedModel:
    """A model (version) in the server's repository index."""

    name: str
    version: str
    state: str
    reason: str = ""


@dataclass
class ServerReport:
    """Everything :func:`~coffea_sonic.facility.check.check_server` found about one target.

    Picklable and free of secrets. Besides the findings: ``restricted`` (protocol groups the
    server refused without a key), ``transport`` (what the workers' requests use: ``shm``,
    ``grpc``, ``http``; ``""`` if undecided), ``shm_usable`` and ``shm_reason`` (the
    shared-memory probe's verdict), ``shm_cause`` (``usable``, ``remote``, ``proxy``,
    ``restricted``, ``dev-shm``, ``unreachable``, ``not-asked``, ``http``).
    """

    target: str
    address: str
    findings: list[Finding] = field(default_factory=list)
    server_version: str = ""
    models: list[ServedModel] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    inference_ms: list[float] = field(default_factory=list)
    where: str = ""
    restricted: list[str] = field(default_factory=list)
    transport: str = ""
    shm_usable: bool | None = None
    shm_reason: str = ""
    shm_cause: str = ""

    @property
    def ok(self) -> bool:
        return all(finding.status != "fail" for finding in self.findings)

    def finding(self, aspect: str) -> Finding | None:
        """The finding about ``aspect`` (reachable, protocol, tls, auth, server, access, model,
        transport, latency)."""
        return next((f for f in self.findings if f.aspect == aspect), None)

    def add(self, aspect: str, status: Status, summary: str, advice: str = "") -> Finding:
        finding = Finding(aspect, status, summary, advice)
        self.findings.append(finding)
        return finding


# -- text -------------------------------------------------------------------------------------------
_BADGES: Mapping[str, str] = {"ok": "[ ok ]", "warn": "[warn]", "fail": "[FAIL]"}
_COLORS: Mapping[str, str] = {"ok": "\033[32m", "warn": "\033[33m", "fail": "\033[31m"}


def render_report(report: ServerReport, *, color: bool = False) -> str:
    """One server's report as text lines with what to do under each warning and failure."""
    reset = "\033[0m" if color else ""
    where = f"  (from {report.where})" if report.where else ""
    lines = [f"{report.target}{where}"]
    for finding in report.findings:
        badge = f"{_COLORS[finding.status] if color else ''}{_BADGES[finding.status]}{reset}"
        lines.append(f"  {badge} {finding.aspect:<9} {finding.summary}")
        if finding.advice and finding.status != "ok":
            lines.append(f"         {'':<9} what to do: {finding.advice}")
    if report.models:
        served = ", ".join(f"{m.name} v{m.version} {m.state}" for m in report.models)
        lines.append(f"         {'served':<9} {served}")
    verdict = "all good" if report.ok else "NOT usable: fix the first [FAIL] above"
    if report.ok and any(finding.status == "warn" for finding in report.findings):
        verdict = "usable (see [warn] above)"
    lines.append(f"  -> {verdict}")
    return "\n".join(lines)


def render_reports(reports: Sequence[ServerReport], *, color: bool = False) -> str:
    """All reports and a summary line.

    >>> render_reports([ServerReport("a", "a")]).splitlines()[-1]
    '1 of 1 server(s) OK'
    """
    good = sum(report.ok for report in reports)
    blocks = [render_report(report, color=color) for report in reports]
    blocks.append(f"{good} of {len(reports)} server(s) OK")
    return "\n\n".join(blocks)
