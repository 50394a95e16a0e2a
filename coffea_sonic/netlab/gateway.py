"""HAProxy as the facility's gateway on a lab host, from ``deploy/haproxy/gateway.cfg`` unchanged.

How it works: docs/internals/gateway.md (with an example).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .processes import HostProcess
from .services import ensure_command

if TYPE_CHECKING:
    from .lab import Host

#: The gateway's policy file, shared by tests, docs and deploy/kubernetes.
GATEWAY_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "gateway.cfg"
GATEWAY_PORT = 8001
GATEWAY_HTTP_PORT = 8000
STATS_PORT = 8404


def servers_config(servers: Sequence[str | tuple[str, int]], *, health_port: int = 8000) -> str:
    """The ``backend tritons`` (gRPC) and ``backend tritons_http`` (HTTP/REST) sections for
    ``servers`` (gRPC ``ip:port``, or ``(ip:port, HTTP port)``), health-checked on Triton's HTTP
    readiness (``health_port`` unless given per server). A server marked down (two failed checks,
    e.g. its host cut off) has its calls reset at once, so that clients resend them elsewhere
    instead of waiting for their deadline on a dead link.

    >>> print(servers_config(["10.0.0.5:8001"]), end="")  # doctest: +ELLIPSIS
    backend tritons
    ...
      server triton1 10.0.0.5:8001 proto h2 check port 8000 check-proto h1 ...
    backend tritons_http
    ...
      server triton1 10.0.0.5:8000 check inter 1s fall 2 rise 1 on-marked-down shutdown-sessions
    """
    check = "inter 1s fall 2 rise 1 on-marked-down shutdown-sessions"
    head = ["  balance leastconn", "  option httpchk", "  http-check send meth GET uri /v2/health/ready"]
    grpc, http = ["backend tritons", *head], ["backend tritons_http", *head]
    for number, server in enumerate(servers, start=1):
        address, port = server if isinstance(server, tuple) else (server, health_port)
        grpc.append(f"  server triton{number} {address} proto h2 check port {port} "
                    f"check-proto h1 {check}")
        http.append(f"  server triton{number} {address.rpartition(':')[0]}:{port} check {check}")
    return "\n".join(grpc + http) + "\n"


@dataclass
class Gateway:
    """A running gateway: ``address`` (gRPC), ``http_address`` (HTTP/REST), ``stats_address``
    (/metrics, /stats), ``process``."""

    host: "Host"
    process: HostProcess
    port: int = GATEWAY_PORT
    stats_port: int = STATS_PORT
    http_port: int = GATEWAY_HTTP_PORT

    @property
    def address(self) -> str:
        return self.host.address(self.port)

    @property
    def stats_address(self) -> str:
        return self.host.address(self.stats_port)

    @property
    def http_address(self) -> str:
        return self.host.address(self.http_port)

    def url(self, model: str, protocol: str = "grpc") -> str:
        """The model's URL through the gateway, over ``grpc`` or ``http``."""
        if protocol == "http":
            return f"triton+http://{self.http_address}/{model}"
        return f"triton+grpc://{self.address}/{model}"

    def restart(self) -> None:
        """Start the gateway again with the same configuration (after :meth:`kill`)."""
        self.process.start()
        self.process.wait_for_port(self.port)

    def kill(self) -> None:
        """SIGKILL the gateway (every client connection through it drops)."""
        self.process.kill()


def start_gateway(host: "Host", servers: Sequence[str | tuple[str, int]], *,
                  public_key: str | os.PathLike, directory: Path, audience: str = "coffea-sonic",
                  quota_rps: int = 1000, retry_after_s: float = 1, port: int = GATEWAY_PORT,
                  stats_port: int = STATS_PORT, http_port: int = GATEWAY_HTTP_PORT,
                  config: Path = GATEWAY_CONFIG) -> Gateway:
    """HAProxy on ``host`` (gRPC on ``port``, HTTP/REST on ``http_port``, metrics on
    ``stats_port``) in front of ``servers``; ``quota_rps``: inference requests/s per token
    subject; ``config``: the policy file (another copy of deploy/haproxy, e.g. one under test).

    Raises :class:`~coffea_sonic.netlab.processes.CommandUnavailableError` where HAProxy is not
    installed and cannot be, and :class:`~coffea_sonic.netlab.processes.ServiceStartError` with
    HAProxy's own messages where it exits (refusing its configuration) or does not listen.
    """
    haproxy = ensure_command("haproxy", "haproxy")
    directory.mkdir(parents=True, exist_ok=True)
    servers_file = directory / f"servers-{port}.cfg"
    servers_file.write_text(servers_config(servers))
    env = {**os.environ, "GATEWAY_BIND": host.address(port),
           "GATEWAY_HTTP_BIND": host.address(http_port),
           "GATEWAY_STATS_BIND": host.address(stats_port), "GATEWAY_JWT_KEY": str(public_key),
           "GATEWAY_JWT_AUDIENCE": audience, "GATEWAY_QUOTA_RPS": str(int(quota_rps)),
           "GATEWAY_RETRY_AFTER_S": f"{retry_after_s:g}"}
    # -db: stay in the foreground, so that the lab owns (and stops) the process itself
    argv = [haproxy, "-db", "-f", str(config), "-f", str(servers_file)]
    process = host.popen(argv, name=f"haproxy-{port}", env=env, grace_s=5.0)
    process.wait_for_port(port)
    process.wait_for_port(http_port)
    return Gateway(host, process, port, stats_port, http_port)
