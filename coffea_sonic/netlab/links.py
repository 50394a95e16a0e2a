"""Links between lab hosts: a rate (tbf on both ends of a veth pair) and the commands shaping them.

No netem here: round trips come from the relay (docs/internals/netlab.md, with examples).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import NetworkLabError
from .netlink import netlink

logger = logging.getLogger(__name__)

#: tbf's bucket: 10 ms of the link's rate (1.25 MB at 1 Gb/s, where raw TCP then moves 96 % of
#: the rate), never under 64 KiB, so that a 64 KiB segmentation-offload packet always fits.
BURST_S = 0.010
MIN_BURST_BYTES = 64 * 1024
#: How long a packet may wait in tbf's queue before it is dropped (the link's buffer).
QUEUE_LATENCY_MS = 20


@dataclass(frozen=True)
class Link:
    """A host's link to the lab's switch: ``rate_mbit`` each way (None: unshaped veth speed) and a
    round-trip time ``rtt_ms`` that relays to services on the host add (0: none).

    >>> Link(1000, rtt_ms=20)
    Link(rate_mbit=1000, rtt_ms=20)
    """

    rate_mbit: float | None = None
    rtt_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise NetworkLabError(f"a link's rate must be > 0 Mbit/s, not {self.rate_mbit!r}")
        if not self.rtt_ms >= 0:
            raise NetworkLabError(f"a link's round-trip time must be >= 0 ms, not {self.rtt_ms!r}")

    @property
    def shaped(self) -> bool:
        """Whether tbf limits the link's rate."""
        return self.rate_mbit is not None

    def burst_bytes(self) -> int:
        """tbf's bucket for this link's rate (:data:`BURST_S` of it, at least 64 KiB)."""
        if self.rate_mbit is None:
            raise NetworkLabError("an unshaped link has no tbf bucket")
        return max(MIN_BURST_BYTES, int(self.rate_mbit * 1e6 / 8 * BURST_S))


def shape(namespace: str, device: str, link: Link) -> None:
    """Set (or remove, for an unshaped link) the rate of ``device``'s egress in ``namespace``."""
    if link.shaped:
        assert link.rate_mbit is not None
        netlink().set_tbf(namespace, device, link.rate_mbit, link.burst_bytes(), QUEUE_LATENCY_MS)
    else:
        netlink().clear_qdisc(namespace, device)
