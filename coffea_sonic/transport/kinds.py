"""The transport kinds and their client defaults (why: docs/internals/transport.md)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KINDS", "REQUESTABLE", "TransportKind", "transport_kind"]


@dataclass(frozen=True)
class TransportKind:
    """One transport kind and its defaults."""

    name: str
    max_request_bytes: int
    max_in_flight: int
    #: ``module:Class`` of its :class:`~coffea_sonic.transport.base.Transport`, built from
    #: ``ServerSettings`` ("" where it is made by hand, e.g. the in-memory transport of tests)
    factory: str
    what: str
    #: connections per server and process (gRPC: requests spread round robin over them;
    #: ``$COFFEA_SONIC_GRPC_CONNECTIONS`` replaces it)
    connections: int = 1


KINDS: dict[str, TransportKind] = {kind.name: kind for kind in (
    # gRPC's row: many worker processes per server (why: docs/internals/transport.md)
    TransportKind("grpc", 9 * 2**20, 2, "coffea_sonic.transport.grpc:GrpcTransport",
                  "Triton's gRPC API"),
    TransportKind("shm", 9 * 2**20, 2, "coffea_sonic.transport.shm:SystemShmTransport",
                  "system shared memory (/dev/shm) to a server on this host"),
    TransportKind("cuda", 32 * 2**20, 2, "coffea_sonic.transport.shm:CudaShmTransport",
                  "CUDA shared memory to a server on this host"),
    TransportKind("http", 4 * 2**20, 4, "coffea_sonic.transport.http:HttpTransport",
                  "Triton's HTTP API with binary tensors"),
    TransportKind("memory", 4 * 2**20, 4, "", "in-process models (unit tests)"),
)}

#: what ``TritonModel(transport=...)`` takes by name ("auto" picks one per server)
REQUESTABLE: tuple[str, ...] = ("auto",) + tuple(name for name, kind in KINDS.items()
                                                 if kind.factory)


def transport_kind(name: str) -> TransportKind:
    """The kind called ``name``; gRPC's defaults for a transport of another name (a factory's)."""
    return KINDS.get(name) or KINDS["grpc"]
