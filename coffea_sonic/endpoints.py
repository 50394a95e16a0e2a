"""One server as this process sees it (:class:`Endpoint`): load, health, what it serves.

Its place among the router and the discovery, with examples: docs/internals/routing.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .core.endpoint import ServerSettings
from .retry import RetryPolicy
from .transport.base import Transport
from .transport.choice import ServerTransports

__all__ = ["Endpoint"]


@dataclass(eq=False)
class Endpoint:
    """One server as this process sees it."""

    settings: ServerSettings
    outstanding: int = 0
    #: model -> versions ready on this server; None until discovered
    served: dict[str, tuple[str, ...]] | None = None
    #: the server restricts its repository index: models are learnt one by one
    index_restricted: bool = False
    #: monotonic time until which the server is quarantined (0: healthy)
    quarantined_until: float = 0.0
    quarantine_s: float = 0.0
    #: monotonic time until which the server is deprioritised as overloaded
    busy_until: float = 0.0
    consecutive_failures: int = 0
    last_error: str = ""
    #: wall-clock time its current quarantine began (for the outage's record)
    down_since: float = 0.0
    #: model -> why this server must not be used for it (signature mismatch)
    incompatible: dict[str, str] = field(default_factory=dict)
    requests: int = 0
    #: which transports carry this server's control calls and requests
    transports: ServerTransports = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.transports is None:
            self.transports = ServerTransports(self.settings)

    @property
    def address(self) -> str:
        return self.settings.address

    @property
    def control(self) -> Transport:
        """The transport of the URL's protocol (gRPC or HTTP)."""
        return self.transports.plain

    # the transport choice's state, read (and in tests set) through the endpoint
    @property
    def data(self) -> Transport | None:
        return self.transports.data

    @data.setter
    def data(self, transport: Transport | None) -> None:
        self.transports.data = transport

    @property
    def shm_off(self) -> str:
        return self.transports.shm_off

    @property
    def cuda_off(self) -> str:
        return self.transports.cuda_off

    @property
    def healthy(self) -> bool:
        return self.quarantined_until == 0.0

    def quarantine(self, policy: RetryPolicy, detail: str, now: float | None = None) -> float:
        """Count one more consecutive failure and leave the server alone for a doubled time
        (within the policy's bounds); returns that time. The caller holds the router's lock."""
        self.consecutive_failures += 1
        self.quarantine_s = policy.next_quarantine_s(self.quarantine_s)
        self.quarantined_until = (time.monotonic() if now is None else now) + self.quarantine_s
        self.last_error = detail
        return self.quarantine_s

    def serves(self, model: str, version: str) -> bool:
        if self.served is None or model in self.incompatible:
            return False
        versions = self.served.get(model)
        if versions is None:
            return False
        return not version or version in versions

    def state(self, model: str = "", version: str = "") -> str:
        """Human-readable state for error messages (no secrets)."""
        now = time.monotonic()
        if not self.healthy:
            left = max(0.0, self.quarantined_until - now)
            return (f"quarantined for {left:.1f} s more after {self.consecutive_failures} "
                    f"failure(s): {self.last_error or 'unreachable'}")
        if model and model in self.incompatible:
            return self.incompatible[model]
        if model and self.served is not None and not self.serves(model, version):
            have = self.served.get(model)
            return (f"does not serve {model}" + (f" version {version}" if version else "")
                    + (f" (has versions {list(have)})" if have else ""))
        if self.busy_until > now:
            return f"overloaded ({self.last_error})"
        return "healthy"
