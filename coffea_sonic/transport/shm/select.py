"""Whether shared memory can serve a server (the probe: docs/internals/transport-shm.md)."""

from __future__ import annotations

import logging
from typing import Any

from ...core.process_local import ProcessLocal
from ...errors import ConfigurationError
from ..errors import TransportError
from .regions import SystemRegion, host_of, is_local_host

__all__ = ["PROBE_CHECKS", "forget_probe", "forget_probes", "probe_shared_memory", "shm_possible"]

logger = logging.getLogger(__name__)

#: Status calls that must all find the probe region (a balancer over N backends escapes 8 calls
#: with probability (1/N)^7 for random choice, never for round-robin).
PROBE_CHECKS = 8


def shm_possible(address: str) -> bool:
    """Whether the server at ``address`` (``host:port``) is on this host."""
    try:
        return is_local_host(host_of(address))
    except ConfigurationError:
        return False


#: this process' final probe answers per server (a forked child probes for itself)
_probes: ProcessLocal[tuple, tuple[bool, str]] = ProcessLocal("shared-memory probes")


def probe_shared_memory(grpc: Any, *, checks: int = PROBE_CHECKS,
                        timeout_s: float = 5.0) -> tuple[bool, str]:
    """``(usable, why)``: whether the server of ``grpc`` (a GrpcTransport) maps this process'
    shared memory *and* serves this channel's requests from the process that mapped it."""
    key = grpc.settings.key()
    known = _probes.peek(key)
    if known is not None:
        return known
    answer, final = _probe(grpc, checks, timeout_s)
    if final:
        _probes.set(key, answer)
    logger.info("shared memory for %s: %s (%s)", grpc.address, "yes" if answer[0] else "no",
                answer[1])
    return answer


def _probe(grpc: Any, checks: int, timeout_s: float) -> tuple[tuple[bool, str], bool]:
    """The answer, and whether it may be cached."""
    if not shm_possible(grpc.address):
        return (False, f"server {grpc.address} is not on this host"), True
    try:
        region = SystemRegion(4096)
    except OSError as error:
        return (False, f"no POSIX shared memory here ({error})"), True
    try:
        try:
            grpc.call("SystemSharedMemoryRegister", timeout_s, name=region.name, key=region.key,
                      offset=0, byte_size=region.size)
        except TransportError as error:
            return (False, f"registration refused: {error.describe()}"), not error.retryable
        region.unlink()
        spread = True  # until every check found the region: unregister everywhere
        try:
            for check in range(checks):
                status = grpc.call("SystemSharedMemoryStatus", timeout_s, name=region.name)
                known = status.regions.get(region.name)
                if known is None or known.key != region.key or known.byte_size != region.size:
                    return (False, f"status call {check + 1} of {checks} did not find the probe "
                                   "region: a proxy or load balancer spreads requests over "
                                   "several servers"), True
            spread = False
        except TransportError as error:
            if error.retryable:
                return (False, f"server unreachable during the probe: {error.describe()}"), False
            return (False, f"status call {check + 1} of {checks} failed ({error.describe()}): a "
                           "proxy or load balancer spreads requests over several servers"), True
        finally:
            _unregister(grpc, region.name, checks if spread else 1, timeout_s)
        return (True, f"{checks} status calls all reached the server that mapped the region"), True
    finally:
        region.close()


def _unregister(grpc: Any, name: str, times: int, timeout_s: float) -> None:
    """Unregister ``name`` ``times`` times: behind a balancer each call may reach another backend
    (Triton answers OK for a name it does not know)."""
    for _ in range(times):
        try:
            grpc.call("SystemSharedMemoryUnregister", timeout_s, name=name)
        except TransportError as error:
            if error.kind in ("down", "timeout"):
                return  # gone: it has forgotten the region with everything else
            logger.debug("unregistering probe region %s at %s: %s", name, grpc.address, error)


def forget_probe(grpc: Any) -> None:
    """Forget the cached probe answer for the server of ``grpc`` (a GrpcTransport)."""
    _probes.pop(grpc.settings.key(), None)


def forget_probes() -> None:
    """Forget every cached probe answer of this process (e.g. after a server moved)."""
    _probes.clear()
