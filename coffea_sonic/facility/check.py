"""``coffea-sonic check``: can this machine (a worker node) use the facility's Triton servers?

For every server it reports, in this order, and stops at the first thing that blocks the rest:

1. **reachable**: DNS, TCP connect (refused = server down or wrong port; timeout = firewall);
2. **protocol**: plaintext gRPC, TLS, or something else (Triton's HTTP or metrics port given as
   the gRPC port);
3. **TLS**: on/off, whether the client is configured to match, certificate verification;
4. **auth**: the bearer token (``--token-env NAME``) accepted or rejected by the server or its
   gateway;
5. **server**: Triton live and ready, its version;
6. **model**: the model (and version) named in the URL is in the repository and READY; every
   model the server has, with versions and states;
7. **latency**: round trips of health calls and of tiny inferences of the named model.

Each failure says what to do. :func:`check_servers` returns :class:`ServerReport` objects;
:func:`render_reports` makes the text; :func:`check_on_workers` runs the same on Dask workers.

>>> report = check_server("127.0.0.1:1", timeout_s=1)
>>> report.ok, report.findings[0].aspect, report.findings[0].status
(False, 'reachable', 'fail')
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..config import DASK_PREFIX, configured_models, configured_servers, setting
from ..errors import ConfigurationError
from . import probe

logger = logging.getLogger(__name__)

__all__ = ["CheckOptions", "Finding", "ServedModel", "ServerReport", "Target", "check_on_workers",
           "check_server", "check_servers", "configured_targets", "parse_target", "render_reports"]

Status = Literal["ok", "warn", "fail"]
#: Triton's default ports, quoted in advice.
DEFAULT_PORTS = {"grpc": 8001, "http": 8000, "metrics": 8002}
_TARGET = re.compile(
    r"^(?:(?P<scheme>[a-z+]+)://)?(?P<host>\[[^\]]+\]|[^:/]+)(?::(?P<port>\d+))?"
    r"(?:/(?P<model>[^/]+)(?:/(?P<version>[^/]+))?)?/?$")
_TLS_SCHEMES = {"triton+grpc": False, "grpc": False, "triton+grpcs": True, "grpcs": True}


@dataclass(frozen=True)
class Target:
    """One server to check, optionally with the model (and version) that must be there.

    >>> parse_target("triton+grpcs://gpu.example.org/jet_tagger/2")
    Target(host='gpu.example.org', port=8001, tls=True, model='jet_tagger', version='2')
    """

    host: str
    port: int
    tls: bool | None = None
    model: str = ""
    version: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def label(self) -> str:
        scheme = {None: "", False: "triton+grpc://", True: "triton+grpcs://"}[self.tls]
        path = f"/{self.model}" + (f"/{self.version}" if self.version else "") if self.model else ""
        return f"{scheme}{self.address}{path}"


def parse_target(text: str) -> Target:
    """``host[:port]``, ``triton+grpc[s]://host[:port][/model[/version]]`` or ``grpc[s]://...``.

    >>> parse_target("127.0.0.1:8001")
    Target(host='127.0.0.1', port=8001, tls=None, model='', version='')
    >>> parse_target("http://127.0.0.1:8000")
    Traceback (most recent call last):
    ...
    coffea_sonic.errors.ConfigurationError: 'http://127.0.0.1:8000' uses http://, but check talks gRPC: give triton+grpc://host:port/model (Triton's gRPC port is 8001 by default; 8000 is its HTTP port)
    """
    match = _TARGET.match(text.strip())
    scheme = match["scheme"] if match else None
    if scheme in ("http", "https"):
        raise ConfigurationError(
            f"{text!r} uses {scheme}://, but check talks gRPC: give triton+grpc://host:port/model "
            f"(Triton's gRPC port is {DEFAULT_PORTS['grpc']} by default; {DEFAULT_PORTS['http']} "
            "is its HTTP port)")
    if not match or (scheme is not None and scheme not in _TLS_SCHEMES):
        raise ConfigurationError(
            f"cannot read server {text!r}: give host:port or triton+grpc://host:port/model[/version] "
            "(triton+grpcs:// for TLS)")
    host = match["host"].strip("[]")
    return Target(host=host, port=int(match["port"] or DEFAULT_PORTS["grpc"]),
                  tls=_TLS_SCHEMES.get(scheme) if scheme else None,
                  model=match["model"] or "", version=match["version"] or "")


def configured_targets() -> list[str]:
    """Every server URL this environment is configured with (what a worker would use).

    Sources as in :mod:`coffea_sonic.config`: ``COFFEA_SONIC_MODEL_<NAME>``, Dask config
    ``coffea_sonic.models``, the facility file's ``[models]``, and ``COFFEA_SONIC_SERVERS``.

    >>> import os
    >>> os.environ["COFFEA_SONIC_MODEL_JET_TAGGER"] = "triton+grpc://gpu1:8001/jet_tagger"
    >>> configured_targets()
    ['triton+grpc://gpu1:8001/jet_tagger']
    >>> del os.environ["COFFEA_SONIC_MODEL_JET_TAGGER"]
    """
    urls = [url for model_urls in configured_models().values() for url in model_urls]
    urls += configured_servers()
    return list(dict.fromkeys(urls))


@dataclass(frozen=True)
class CheckOptions:
    """How to talk to the servers. Secrets are given by variable name or file, never by value.

    ``tls``: None = as the URL says (``triton+grpcs://`` = TLS); ``ca_file``: PEM bundle to trust
    (None: system roots); ``cert_file``/``key_file``: client identity for mutual TLS;
    ``server_name``: name to verify the certificate against (tunnels). ``token_env`` /
    ``token_file``: where the bearer token is read from (``COFFEA_SONIC_TOKEN_ENV`` by default).

    >>> CheckOptions(token_env="SONIC_TOKEN").token_source
    '$SONIC_TOKEN'
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

    @property
    def token_source(self) -> str | None:
        if self.token_file:
            return self.token_file
        name = self.token_env or setting("token_env")
        return f"${name}" if name else None

    def token(self) -> str | None:
        """The token's value, read now (raises ConfigurationError naming the source if absent)."""
        if self.token_file:
            try:
                value = Path(self.token_file).read_text().strip()
            except OSError as error:
                raise ConfigurationError(
                    f"cannot read the token file {self.token_file}: {error.strerror}") from None
        else:
            name = self.token_env or setting("token_env")
            if not name:
                return None
            value = os.environ.get(name, "").strip()
            if not value:
                raise ConfigurationError(
                    f"the token variable {name} is not set in this environment: export it (on "
                    "Dask workers: forward it by name, make_cluster(env=[...]))")
        return value


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
    """Everything :func:`check_server` found about one target (picklable, holds no secret)."""

    target: str
    address: str
    findings: list[Finding] = field(default_factory=list)
    server_version: str = ""
    models: list[ServedModel] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    inference_ms: list[float] = field(default_factory=list)
    where: str = ""

    @property
    def ok(self) -> bool:
        return all(finding.status != "fail" for finding in self.findings)

    def finding(self, aspect: str) -> Finding | None:
        """The finding about ``aspect`` (reachable, protocol, tls, auth, server, model, latency)."""
        return next((f for f in self.findings if f.aspect == aspect), None)

    def add(self, aspect: str, status: Status, summary: str, advice: str = "") -> Finding:
        finding = Finding(aspect, status, summary, advice)
        self.findings.append(finding)
        return finding


# -- the checks ------------------------------------------------------------------------------
def _check_network(target: Target, options: CheckOptions, report: ServerReport) -> bool:
    connect = probe.tcp_connect(target.host, target.port, options.timeout_s)
    if connect.error == "dns":
        report.add("reachable", "fail", f"host name {target.host!r} does not resolve ({connect.detail})",
                   "check the spelling; worker nodes may need the facility-internal name or IP")
        return False
    if connect.error == "refused":
        report.add("reachable", "fail", f"connection refused on {target.address}: nothing listens there",
                   "the server is down or listens on another port: start it (coffea-sonic serve), "
                   "or check the port (Triton's defaults: gRPC 8001, HTTP 8000, metrics 8002)")
        return False
    if connect.error == "timeout":
        report.add("reachable", "fail",
                   f"no answer from {target.address} within {options.timeout_s:.0f} s",
                   "a firewall drops the traffic, or the host is down: ask the facility whether "
                   "worker nodes may reach this server and port")
        return False
    if connect.error:
        report.add("reachable", "fail", f"cannot reach {target.address}: {connect.detail}",
                   "this node has no route to the server: ask the facility which address worker "
                   "nodes must use")
        return False
    report.add("reachable", "ok", f"TCP connect to {target.address} in {connect.seconds * 1e3:.1f} ms")
    return True


def _check_protocol(target: Target, options: CheckOptions, report: ServerReport) -> bool | None:
    """Classify the port; return whether it speaks TLS (None: not gRPC at all, stop)."""
    kind, _ = probe.sniff_protocol(target.host, target.port, options.timeout_s)
    if kind == "h2":
        report.add("protocol", "ok", "HTTP/2 (gRPC) without TLS")
        return False
    handshake = probe.tls_handshake(target.host, target.port, timeout_s=options.timeout_s)
    if handshake.speaks_tls:
        report.add("protocol", "ok", "TLS" + (f" ({handshake.alpn})" if handshake.alpn else ""))
        return True
    http_kind = probe.identify_http_port(target.host, target.port, options.timeout_s)
    if http_kind in ("http", "metrics"):
        name = "HTTP/REST" if http_kind == "http" else "Prometheus metrics"
        defaults = target.port == DEFAULT_PORTS[http_kind]
        grpc_port = DEFAULT_PORTS["grpc"] if defaults else "<grpc-port>"
        report.add("protocol", "fail",
                   f"{target.address} is Triton's {name} port, not its gRPC port",
                   f"give the server's gRPC port instead (Triton's defaults: gRPC "
                   f"{DEFAULT_PORTS['grpc']}, HTTP {DEFAULT_PORTS['http']}, metrics "
                   f"{DEFAULT_PORTS['metrics']}): "
                   f"triton+grpc://{target.host}:{grpc_port}/{target.model or '<model>'}")
        return None
    if http_kind == "http1":
        report.add("protocol", "fail", f"{target.address} answers HTTP/1, not gRPC",
                   "this is a web service, not a Triton gRPC endpoint: check the port (Triton's "
                   f"gRPC default is {DEFAULT_PORTS['grpc']})")
        return None
    report.add("protocol", "fail", f"{target.address} accepts connections but does not speak gRPC "
               f"(answer to the HTTP/2 preface: {kind})",
               f"something else listens on this port: check the port (Triton's gRPC default is "
               f"{DEFAULT_PORTS['grpc']}) or ask the facility for the server address")
    return None


def _check_tls(target: Target, options: CheckOptions, report: ServerReport, server_tls: bool) -> bool:
    want_tls = options.tls if options.tls is not None else bool(target.tls)
    if server_tls and not want_tls:
        report.add("tls", "fail", "the server requires TLS, but the client is not configured for it",
                   f"use triton+grpcs://{target.address}/{target.model or '<model>'} (or --ssl), and "
                   "--ssl-ca FILE if its certificate is not signed by a public CA")
        return False
    if not server_tls and want_tls:
        report.add("tls", "fail", "TLS is requested, but the server speaks plaintext gRPC",
                   f"use triton+grpc://{target.address}/... (no TLS), or ask the facility for its "
                   "TLS endpoint")
        return False
    if not server_tls:
        report.add("tls", "ok", "off: plaintext gRPC (fine inside a facility's private network)")
        return True
    verified = probe.tls_handshake(target.host, target.port, ca_file=options.ca_file,
                                   server_name=options.server_name, cert_file=options.cert_file,
                                   key_file=options.key_file, timeout_s=options.timeout_s)
    trust = f"CA {options.ca_file}" if options.ca_file else "the system's CA roots"
    if not verified.verified:
        report.add("tls", "fail", f"the server's certificate is not trusted with {trust}: "
                   f"{verified.error}",
                   "pass the facility's CA bundle with --ssl-ca FILE; if you connect through a "
                   "tunnel, --ssl-target-name NAME (the name in the certificate)")
        return False
    report.add("tls", "ok", f"{verified.version}, certificate of {verified.peer_subject or '?'} "
               f"verified with {trust}")
    return True


def _status_code(error: Exception) -> str:
    status = getattr(error, "status", None)
    code = status() if callable(status) else ""
    return str(code or "").replace("StatusCode.", "")


def _message(error: Exception) -> str:
    message = getattr(error, "message", None)
    return str(message() if callable(message) else error)


def _grpc_client(target: Target, options: CheckOptions, use_tls: bool):
    import tritonclient.grpc as triton_grpc

    channel_args = [("grpc.max_send_message_length", 2**31 - 1),
                    ("grpc.max_receive_message_length", 2**31 - 1)]
    if options.server_name:
        channel_args.append(("grpc.ssl_target_name_override", options.server_name))
    return triton_grpc.InferenceServerClient(
        url=target.address, ssl=use_tls, root_certificates=options.ca_file,
        private_key=options.key_file, certificate_chain=options.cert_file,
        channel_args=channel_args)


def _auth_failure(report: ServerReport, options: CheckOptions, sent_token: bool, code: str,
                  detail: str) -> None:
    if sent_token:
        report.add("auth", "fail", f"the token from {options.token_source} was rejected ({code}: {detail})",
                   "the token is wrong, expired or for another service: get a fresh one from the "
                   "facility and export it again")
    else:
        report.add("auth", "fail", f"the server (or its gateway) requires a token ({code}: {detail})",
                   "export the facility's token in a variable and pass --token-env NAME (Python: "
                   "CheckOptions(token_env=NAME); workers: make_cluster(env=[NAME]))")


def _check_grpc(target: Target, options: CheckOptions, report: ServerReport, use_tls: bool) -> None:
    try:
        token = options.token()
    except ConfigurationError as error:
        report.add("auth", "fail", str(error), "set the token variable, or drop --token-env")
        return
    headers = {}
    if token:
        headers["authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
    client = _grpc_client(target, options, use_tls)
    timeout = options.timeout_s
    try:
        try:
            started = time.perf_counter()
            live = client.is_server_live(headers=headers, client_timeout=timeout)
            first_ms = (time.perf_counter() - started) * 1e3
        except Exception as error:  # tritonclient raises InferenceServerException
            code, detail = _status_code(error), _message(error)
            if code in ("UNAUTHENTICATED", "PERMISSION_DENIED") or "restricted" in detail.lower():
                _auth_failure(report, options, bool(token), code, detail)
            elif code == "DEADLINE_EXCEEDED":
                report.add("server", "fail", f"no gRPC answer within {timeout:.0f} s",
                           "the server is overloaded or hanging: check its load (coffea-sonic "
                           "monitor) or ask the facility")
            else:
                report.add("server", "fail", f"gRPC call failed: {code}: {detail}",
                           "if TLS is involved, check --ssl-ca / client certificate; otherwise "
                           "the server is not a healthy Triton: ask the facility")
            return
        report.add("auth", "ok", f"token from {options.token_source} accepted" if token
                   else "no token sent; the server did not ask for one")
        ready = client.is_server_ready(headers=headers, client_timeout=timeout)
        metadata = client.get_server_metadata(headers=headers, client_timeout=timeout)
        report.server_version = f"{metadata.name} {metadata.version}"
        if live and ready:
            report.add("server", "ok", f"{report.server_version}: live and ready")
        else:
            report.add("server", "fail", f"{report.server_version}: live={live} ready={ready}",
                       "the server is starting or a model failed to load: wait and retry, or ask "
                       "the facility to look at the server log")
        config = _check_models(target, options, report, client, headers)
        _measure_latency(target, options, report, client, headers, first_ms, config)
    finally:
        client.close()


def _check_models(target: Target, options: CheckOptions, report: ServerReport, client: Any,
                  headers: dict[str, str]) -> dict[str, Any] | None:
    """Record the served models; check the named one; return its config if it is ready."""
    try:
        index = client.get_model_repository_index(headers=headers, client_timeout=options.timeout_s)
        report.models = sorted(
            (ServedModel(entry.name, entry.version or "", entry.state or "UNKNOWN", entry.reason)
             for entry in index.models), key=lambda m: (m.name, m.version))
    except Exception as error:
        report.add("models", "warn", f"the repository index is not available: {_message(error)}",
                   "the server restricts it; the named model is checked directly")
    if not target.model:
        return None
    entries = [entry for entry in report.models if entry.name == target.model]
    listing = ", ".join(sorted({entry.name for entry in report.models})) or "none"
    if report.models and not entries:
        report.add("model", "fail", f"{target.model!r} is not in the server's repository (it has: "
                   f"{listing})", "check the model name in your URL/config, or ask the facility "
                   "to load the model")
        return None
    try:
        ready = client.is_model_ready(target.model, target.version, headers=headers,
                                      client_timeout=options.timeout_s)
    except Exception as error:
        ready, detail = False, _message(error)
    else:
        detail = ""
    if not ready:
        states = ", ".join(f"v{e.version or '?'} {e.state}{': ' + e.reason if e.reason else ''}"
                           for e in entries) or detail
        wanted = f"{target.model} version {target.version}" if target.version else target.model
        report.add("model", "fail", f"{wanted} is not ready ({states or 'unknown to the server'})",
                   "drop the version from the URL to use the latest, or ask the facility to load "
                   "it (a failed load is explained in the server log)")
        return None
    config = client.get_model_config(target.model, target.version, headers=headers,
                                      client_timeout=options.timeout_s, as_json=True)["config"]
    versions = ", ".join(f"v{e.version} {e.state}" for e in entries) or "ready"
    signature = "; ".join(
        f"{tensor['name']} {tensor['data_type'].removeprefix('TYPE_')}{list(map(int, tensor['dims']))}"
        for tensor in config.get("input", []))
    outputs = "; ".join(
        f"{tensor['name']}{list(map(int, tensor['dims']))}" for tensor in config.get("output", []))
    report.add("model", "ok", f"{target.model}: {versions}; inputs {signature} -> {outputs}; "
               f"max batch {config.get('max_batch_size', 0)}")
    return config


def _tiny_inputs(config: Mapping[str, Any]) -> list[Any]:
    import tritonclient.grpc as triton_grpc
    from tritonclient.utils import triton_to_np_dtype

    batched = int(config.get("max_batch_size", 0)) > 0
    inputs = []
    for tensor in config.get("input", []):
        datatype = tensor["data_type"].removeprefix("TYPE_")
        datatype = {"STRING": "BYTES"}.get(datatype, datatype)
        shape = [max(int(dim), 1) for dim in tensor["dims"]]
        if batched:
            shape = [1, *shape]
        array = np.zeros(shape, dtype=triton_to_np_dtype(datatype))
        item = triton_grpc.InferInput(tensor["name"], shape, datatype)
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def _measure_latency(target: Target, options: CheckOptions, report: ServerReport, client: Any,
                     headers: dict[str, str], first_ms: float,
                     config: Mapping[str, Any] | None) -> None:
    for _ in range(options.pings):
        started = time.perf_counter()
        client.is_server_live(headers=headers, client_timeout=options.timeout_s)
        report.health_ms.append((time.perf_counter() - started) * 1e3)
    summary = (f"health {statistics.median(report.health_ms):.2f} ms median of {options.pings} "
               f"(first call incl. connect {first_ms:.1f} ms)")
    if config is not None:
        try:
            inputs = _tiny_inputs(config)
            for _ in range(options.pings):
                started = time.perf_counter()
                client.infer(target.model, inputs, model_version=target.version, headers=headers,
                             client_timeout=options.timeout_s)
                report.inference_ms.append((time.perf_counter() - started) * 1e3)
        except Exception as error:
            report.add("latency", "warn", summary + f"; a tiny inference failed: {_message(error)}",
                       "the model answers health calls but not requests: ask the facility to "
                       "look at the server log")
            return
        summary += (f"; inference of one {target.model} row "
                    f"{statistics.median(report.inference_ms):.2f} ms median of {options.pings}")
    report.add("latency", "ok", summary)


def check_server(target: str | Target, options: CheckOptions | None = None, **option_values: Any
                 ) -> ServerReport:
    """Check one server; keywords build :class:`CheckOptions` when ``options`` is not given.

    >>> check_server("127.0.0.1:1", timeout_s=1).finding("reachable").advice.split(":")[0]
    'the server is down or listens on another port'
    """
    options = options or CheckOptions(**option_values)
    parsed = parse_target(target) if isinstance(target, str) else target
    report = ServerReport(target=parsed.label, address=parsed.address)
    if not _check_network(parsed, options, report):
        return report
    server_tls = _check_protocol(parsed, options, report)
    if server_tls is None:
        return report
    if not _check_tls(parsed, options, report, server_tls):
        return report
    _check_grpc(parsed, options, report, use_tls=server_tls)
    return report


def check_servers(targets: Iterable[str] | None = None, options: CheckOptions | None = None,
                  **option_values: Any) -> list[ServerReport]:
    """Check each target (default: every server this environment is configured with).

    >>> [r.ok for r in check_servers(["127.0.0.1:1"], timeout_s=1)]
    [False]
    """
    options = options or CheckOptions(**option_values)
    chosen = list(targets) if targets else configured_targets()
    if not chosen:
        raise ConfigurationError(
            "no server to check: give URLs (coffea-sonic check triton+grpc://host:8001/model) or "
            f"configure them (COFFEA_SONIC_MODEL_<NAME>, COFFEA_SONIC_SERVERS, dask config "
            f"{DASK_PREFIX}.models, or the facility file)")
    return [check_server(target, options) for target in chosen]


def _run_on_worker(targets: list[str], options: CheckOptions) -> list[ServerReport]:
    import socket

    reports = check_servers(targets, options)
    for report in reports:
        report.where = socket.gethostname()
    return reports


def check_on_workers(client: Any, targets: Sequence[str] | None = None,
                     options: CheckOptions | None = None, **option_values: Any
                     ) -> dict[str, list[ServerReport]]:
    """Run the check on every Dask worker (what the analysis will see), by worker address.

    Targets default to this process's configuration; the token is read on each worker from
    ``token_env`` (forward it by name: ``make_cluster(env=[NAME])``).
    """
    options = options or CheckOptions(**option_values)
    chosen = list(targets) if targets else configured_targets()
    return client.run(_run_on_worker, chosen, options)


# -- text -----------------------------------------------------------------------------------
_BADGES = {"ok": "[ ok ]", "warn": "[warn]", "fail": "[FAIL]"}


def render_report(report: ServerReport, *, color: bool = False) -> str:
    """One server's report as text lines with what to do under each failure.

    >>> print(render_report(check_server("127.0.0.1:1", timeout_s=1)).splitlines()[1])
      [FAIL] reachable connection refused on 127.0.0.1:1: nothing listens there
    """
    colors = {"ok": "\033[32m", "warn": "\033[33m", "fail": "\033[31m"} if color else {}
    reset = "\033[0m" if color else ""
    where = f"  (from {report.where})" if report.where else ""
    lines = [f"{report.target}{where}"]
    for finding in report.findings:
        badge = f"{colors.get(finding.status, '')}{_BADGES[finding.status]}{reset}"
        lines.append(f"  {badge} {finding.aspect:<9} {finding.summary}")
        if finding.advice and finding.status != "ok":
            lines.append(f"         {'':<9} what to do: {finding.advice}")
    if report.models:
        served = ", ".join(f"{m.name} v{m.version} {m.state}" for m in report.models)
        lines.append(f"         {'served':<9} {served}")
    verdict = "all good" if report.ok else "NOT usable: fix the first [FAIL] above"
    lines.append(f"  -> {verdict}")
    return "\n".join(lines)


def render_reports(reports: Sequence[ServerReport], *, color: bool = False) -> str:
    """All reports and a summary line."""
    good = sum(report.ok for report in reports)
    blocks = [render_report(report, color=color) for report in reports]
    blocks.append(f"{good} of {len(reports)} server(s) OK")
    return "\n\n".join(blocks)
