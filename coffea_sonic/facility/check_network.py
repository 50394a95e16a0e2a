"""The network steps of ``coffea-sonic check``: reachable, protocol, TLS.

What they tell apart: docs/internals/facility.md, "The network steps" (with an example).
"""

from __future__ import annotations

from ..core.tls import TlsOptions
from . import probe
from .check_report import DEFAULT_PORTS, CheckOptions, ServerReport, Target

__all__ = ["check_protocol", "check_reachable", "check_tls"]


def check_reachable(target: Target, options: CheckOptions, report: ServerReport) -> bool:
    """DNS and a TCP connect; whether anything listens."""
    connect = probe.tcp_connect(target.host, target.port, options.timeout_s)
    if connect.error == "dns":
        report.add("reachable", "fail",
                   f"host name {target.host!r} does not resolve ({connect.detail})",
                   "check the spelling; worker nodes may need the facility-internal name or IP")
        return False
    if connect.error == "refused":
        report.add("reachable", "fail",
                   f"connection refused on {target.address}: nothing listens there",
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
    report.add("reachable", "ok",
               f"TCP connect to {target.address} in {connect.seconds * 1e3:.1f} ms")
    return True


def check_protocol(target: Target, options: CheckOptions, report: ServerReport) -> bool | None:
    """What the port speaks; returns whether it is TLS (None: not the protocol wanted, stop)."""
    if target.protocol == "http":
        return _check_http_protocol(target, options, report)
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
        alternative = (f", or use its HTTP API: triton+http://{target.address}/"
                       f"{target.model or '<model>'}" if http_kind == "http" else "")
        report.add("protocol", "fail",
                   f"{target.address} is Triton's {name} port, not its gRPC port",
                   f"give the server's gRPC port instead (Triton's defaults: gRPC "
                   f"{DEFAULT_PORTS['grpc']}, HTTP {DEFAULT_PORTS['http']}, metrics "
                   f"{DEFAULT_PORTS['metrics']}): "
                   f"triton+grpc://{target.host}:{grpc_port}/{target.model or '<model>'}"
                   + alternative)
        return None
    if http_kind == "http1":
        report.add("protocol", "fail", f"{target.address} answers HTTP/1, not gRPC",
                   "this is a web service, not a Triton gRPC endpoint: check the port (Triton's "
                   f"gRPC default is {DEFAULT_PORTS['grpc']})")
        return None
    report.add("protocol", "fail",
               f"{target.address} accepts connections but does not speak gRPC (answer to the "
               f"HTTP/2 preface: {kind})",
               f"something else listens on this port: check the port (Triton's gRPC default is "
               f"{DEFAULT_PORTS['grpc']}) or ask the facility for the server address")
    return None


def _check_http_protocol(target: Target, options: CheckOptions,
                         report: ServerReport) -> bool | None:
    if target.tls:
        handshake = probe.tls_handshake(target.host, target.port, timeout_s=options.timeout_s)
        if handshake.speaks_tls:
            report.add("protocol", "ok", "TLS (Triton's HTTP API is checked after the handshake)")
            return True
    http_kind = probe.identify_http_port(target.host, target.port, options.timeout_s)
    if http_kind == "http":
        report.add("protocol", "ok", "HTTP/1.1: Triton's HTTP/REST API")
        return False
    if http_kind == "metrics":
        report.add("protocol", "fail", f"{target.address} is Triton's Prometheus metrics port",
                   f"give its HTTP port (default {DEFAULT_PORTS['http']}) or its gRPC port "
                   f"(default {DEFAULT_PORTS['grpc']}) with triton+grpc://")
        return None
    kind, _ = probe.sniff_protocol(target.host, target.port, options.timeout_s)
    if kind == "h2":
        report.add("protocol", "fail", f"{target.address} speaks gRPC, not Triton's HTTP API",
                   f"use triton+grpc://{target.address}/{target.model or '<model>'}")
        return None
    if kind == "tls" or probe.tls_handshake(target.host, target.port,
                                            timeout_s=options.timeout_s).speaks_tls:
        report.add("protocol", "ok", "TLS")
        return True
    report.add("protocol", "fail",
               f"{target.address} does not answer as Triton's HTTP API ({http_kind or kind})",
               f"check the port (Triton's HTTP default is {DEFAULT_PORTS['http']})")
    return None


def check_tls(target: Target, options: CheckOptions, report: ServerReport, server_tls: bool,
              tls: TlsOptions | None) -> bool:
    """Whether the client's TLS setting matches the server, and the certificate verifies with
    ``tls`` (the options the workers will use)."""
    want_tls = options.tls if options.tls is not None else bool(target.tls)
    scheme = f"triton+{target.protocol}s://"
    if server_tls and not want_tls:
        report.add("tls", "fail", "the server requires TLS, but the client is not configured for it",
                   f"use {scheme}{target.address}/{target.model or '<model>'} (or --tls), and "
                   "--ca-file FILE if its certificate is not signed by a public CA")
        return False
    if not server_tls and want_tls:
        report.add("tls", "fail", "TLS is requested, but the server speaks plaintext",
                   f"use triton+{target.protocol}://{target.address}/... (no TLS), or ask the "
                   "facility for its TLS endpoint")
        return False
    if not server_tls:
        report.add("tls", "ok", "off: plaintext (fine inside a facility's private network)")
        return True
    tls = tls or TlsOptions()
    key_file = tls.private_key if isinstance(tls.private_key, str) else None
    verified = probe.tls_handshake(
        target.host, target.port, ca_file=tls.root_certificates, server_name=tls.server_name,
        cert_file=tls.certificate_chain if key_file else None, key_file=key_file,
        timeout_s=options.timeout_s)
    trust = f"CA {tls.root_certificates}" if tls.root_certificates else "the system's CA roots"
    if not verified.verified:
        report.add("tls", "fail",
                   f"the server's certificate is not trusted with {trust}: {verified.error}",
                   "pass the facility's CA bundle with --ca-file FILE (workers: the setting "
                   "ca_file, COFFEA_SONIC_CA_FILE); through a tunnel also --server-name NAME "
                   "(the name in the certificate)")
        return False
    report.add("tls", "ok", f"{verified.version}, certificate of {verified.peer_subject or '?'} "
               f"verified with {trust}")
    return True
