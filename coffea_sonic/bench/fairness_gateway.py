"""Policy ``gateway`` of the fairness scenario: fairness enforced by the facility, not the clients.

Every user reaches the server through HAProxy configured from ``deploy/haproxy/gateway.cfg`` (the
facility's gateway: JWT bearer tokens, a quota of inference requests per second per token
subject), on loopback, each user with a token of its own subject. The server has no priority
levels and the heavy user no yield gate: over its quota the gateway answers RESOURCE_EXHAUSTED
(with ``retry-after``) and the heavy user's client backs off. The quota sits above a light
user's paced rate (``1 / interval_s`` requests/s: light users are never refused) and well under
the heavy user's. Needs the ``haproxy`` and ``openssl`` commands, not root.

>>> gateway_quota(interval_s=0.16, factor=1.6)
10
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from pathlib import Path
from typing import Iterator

__all__ = ["gateway_quota", "user_gateway"]


def gateway_quota(interval_s: float, factor: float) -> int:
    """Requests/s per subject: ``factor`` times a light user's paced rate, rounded up."""
    return max(1, math.ceil(factor / interval_s))


@contextlib.contextmanager
def user_gateway(server, users: int, quota_rps: int,
                 retry_after_s: float) -> Iterator[tuple[str, list[str]]]:
    """The gateway in front of ``server`` (a started LocalTritonServer): yields its gRPC address
    and one token file per user (subject ``user<i>``); stops it on exit."""
    from ..netlab import LocalHost
    from ..netlab.gateway import start_gateway
    from ..netlab.tokens import TokenIssuer
    from ..server.launcher import free_port

    with tempfile.TemporaryDirectory(prefix="fairness-gateway-") as folder, \
            LocalHost(Path(folder) / "logs") as here:
        issuer = TokenIssuer(Path(folder) / "issuer")
        tokens = [str(issuer.write(Path(folder) / f"user{index}.token", f"user{index}"))
                  for index in range(users)]
        gateway = start_gateway(here, [(server.grpc_address, server.ports["http"])],
                                public_key=issuer.public_key, directory=Path(folder) / "gateway",
                                quota_rps=quota_rps, retry_after_s=retry_after_s,
                                port=free_port(), stats_port=free_port(), http_port=free_port())
        yield gateway.address, tokens
