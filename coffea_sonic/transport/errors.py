"""The one error classifier, whatever the wire (kinds: docs/internals/transport.md)."""

from __future__ import annotations

import functools
import re
from typing import Any

from ..errors import (AuthenticationError, ConfigurationError, InferenceError,
                      InputValidationError, ModelNotFoundError, ServerUnavailableError, SonicError)

__all__ = ["KINDS", "TransportError", "classify", "from_grpc", "from_http_status",
           "to_sonic_error"]

KINDS = ("busy", "down", "timeout", "shm_region", "restricted", "unauthenticated", "not_found",
         "bad_request", "cancelled", "internal")

#: Fragments of error details that mean "this server, right now" even under a generic status.
TRANSIENT_MESSAGES: tuple[str, ...] = (
    "connection reset", "socket closed", "broken pipe", "stream removed", "rst_stream",
    "goaway", "endpoint read failed", "failed to connect", "connection refused",
    "stub process is not healthy", "exceeds maximum queue size", "server is not ready",
    "shutting down",
)
# the server does not know (or lost) the region a request names; other shared-memory errors (an
# answer larger than the space reserved for it) are the answer's fault, not the region's
_SHM_REGION = re.compile(
    r"unable to find (?:system |cuda )?shared[ _]memory region|shared[ _]memory region '[^']*' "
    r"(?:not found|does not exist)|unknown (?:system |cuda )?shared[ _]memory region|"
    r"failed to (?:register|open|map) .*shared[ _]memory|invalid (?:system |cuda )?shared[ _]memory "
    r"region", re.IGNORECASE)
_RESTRICTED = re.compile(r"protocol is restricted|api is restricted|restricted, expecting header",
                         re.IGNORECASE)
# statistics of a model a server does not have come back as INVALID_ARGUMENT on both wires
_MISSING_MODEL = re.compile(r"requested model '[^']*' is not available|unknown model",
                            re.IGNORECASE)
_BUSY = re.compile(r"queue size|too many|resource[ _]exhausted", re.IGNORECASE)


def classify(code: str, details: str = "") -> str:
    """The kind of a failure with gRPC status name ``code`` and server ``details``."""
    code = code.removeprefix("StatusCode.")
    lowered = details.lower()
    if _RESTRICTED.search(details):
        return "restricted"
    if _SHM_REGION.search(details) and code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        return "shm_region"
    if code == "RESOURCE_EXHAUSTED" or (_BUSY.search(details) and code != "INVALID_ARGUMENT"):
        return "busy"
    if code == "DEADLINE_EXCEEDED":
        return "timeout"
    if code in ("UNAVAILABLE", "ABORTED"):
        return "down"
    if code in ("UNKNOWN", "INTERNAL", "CANCELLED") and any(
            fragment in lowered for fragment in TRANSIENT_MESSAGES):
        return "down"
    if code == "CANCELLED":
        return "cancelled"
    if code == "NOT_FOUND" or _MISSING_MODEL.search(details):
        return "not_found"
    if code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return "unauthenticated"
    if code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE"):
        return "bad_request"
    return "internal"


class TransportError(SonicError):
    """A classified failure of one call to one server (kinds: docs/internals/transport.md)."""

    def __init__(self, kind: str, detail: str, *, address: str = "", code: str = "",
                 retry_after_s: float | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown transport error kind {kind!r}")
        self.kind, self.detail, self.address, self.code = kind, detail, address, code
        #: how long the server (or gateway) asked us to wait before sending again, if it said
        self.retry_after_s = retry_after_s
        #: ``shm_region`` only: a region an earlier error had already shown forgotten (the same
        #: server forgetting, met by another request in flight), not a new forgetting
        self.repeated = False
        where = f" at {address}" if address else ""
        super().__init__(f"{code or kind}{where}: {detail}" if detail else f"{code or kind}{where}")

    @property
    def retryable(self) -> bool:
        """Whether sending the request again (maybe elsewhere) may succeed."""
        return self.kind in ("busy", "down", "timeout")

    @property
    def over_quota(self) -> bool:
        """A refusal by a quota (a gateway's policy for this user), not a server's overload.

        >>> TransportError("busy", "quota exceeded: 10 inference requests/s").over_quota
        True
        >>> TransportError("busy", "Exceeds maximum queue size").over_quota
        False
        """
        return self.kind == "busy" and "quota" in self.detail.lower()

    @property
    def outcome(self) -> str:
        """What it says about the server: ``busy``, ``down`` or ``other`` (the request's fault)."""
        if self.kind == "busy":
            return "busy"
        return "down" if self.kind in ("down", "timeout") else "other"

    def describe(self) -> str:
        """``CODE: details`` as the server put it."""
        return f"{self.code or self.kind}: {self.detail}" if self.detail else (self.code or self.kind)

    def __reduce__(self):
        return (functools.partial(TransportError, address=self.address, code=self.code,
                                  retry_after_s=self.retry_after_s),
                (self.kind, self.detail), {"repeated": self.repeated})


def retry_after(metadata: Any) -> float | None:
    """Seconds from a ``retry-after`` entry of gRPC trailing metadata or HTTP headers (pairs or a
    mapping), None if absent or not a non-negative number (an HTTP date is not honoured).

    >>> retry_after((("retry-after", "0.5"),)), retry_after({"Retry-After": "2"})
    (0.5, 2.0)
    >>> retry_after(()), retry_after((("retry-after", "Wed, 21 Oct 2026 07:28:00 GMT"),))
    (None, None)
    """
    pairs = metadata.items() if hasattr(metadata, "items") else (metadata or ())
    for key, value in pairs:
        if str(key).lower() == "retry-after":
            try:
                seconds = float(value)
            except (TypeError, ValueError):
                return None
            return seconds if seconds >= 0 else None
    return None


def from_grpc(error: BaseException, address: str = "") -> TransportError:
    """A ``grpc.RpcError`` (or anything else raised by a gRPC call) as a TransportError."""
    if isinstance(error, TransportError):
        return error
    code_of = getattr(error, "code", None)
    if callable(code_of):
        code = getattr(code_of(), "name", str(code_of()))
        details_of = getattr(error, "details", None)
        details = (details_of() if callable(details_of) else "") or ""
        trailing = getattr(error, "trailing_metadata", None)
        try:
            wait = retry_after(trailing() if callable(trailing) else None)
        except Exception:  # noqa: BLE001 - a call that never started has no metadata
            wait = None
        return TransportError(classify(code, details), details.strip(), address=address, code=code,
                              retry_after_s=wait)
    if isinstance(error, (ConnectionError, TimeoutError, OSError)):
        return TransportError("down", f"{type(error).__name__}: {error}", address=address)
    return TransportError("internal", f"{type(error).__name__}: {error}", address=address)


#: HTTP statuses of Triton's HTTP/REST API, in gRPC's words (one classifier for both).
_HTTP_CODES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
               404: "NOT_FOUND", 408: "DEADLINE_EXCEEDED", 429: "RESOURCE_EXHAUSTED",
               499: "CANCELLED", 500: "INTERNAL", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
               504: "DEADLINE_EXCEEDED"}


def from_http_status(status: int, details: str, address: str = "",
                     headers: Any = None) -> TransportError:
    """An HTTP error answer as a TransportError (statuses mapped to gRPC's names first);
    ``headers``: the answer's, for a ``Retry-After``."""
    code = _HTTP_CODES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
    return TransportError(classify(code, details), details.strip(), address=address,
                          code=f"HTTP {status}", retry_after_s=retry_after(headers))


def to_sonic_error(error: BaseException, *, model: str, version: str = "",
                   address: str = "", credentials: str = "") -> SonicError:
    """The public exception a user sees for a failure serving ``model``/``version``.

    ``credentials``: where our token came from
    (:meth:`~coffea_sonic.core.endpoint.ServerSettings.credential_source`), for a refusal.

    >>> refused = TransportError("unauthenticated", "token expired", address="gw:8001",
    ...                          code="UNAUTHENTICATED")
    >>> print(to_sonic_error(refused, model="m", credentials="the token from env:SONIC_TOKEN"))
    gw:8001 refused our credentials for model 'm' (UNAUTHENTICATED: token expired); we sent the token from env:SONIC_TOKEN: renew it, or check that it is meant for this server or gateway (issuer, audience)
    """
    if isinstance(error, SonicError) and not isinstance(error, TransportError):
        return error
    if not isinstance(error, TransportError):
        error = from_grpc(error, address)
    address = error.address or address
    what = f"model {model!r}" + (f" version {version}" if version else "")
    text = error.describe()
    kind = error.kind
    if kind == "not_found":
        return ModelNotFoundError(f"Triton at {address} does not serve {what} ({text})")
    if kind == "unauthenticated":
        if credentials:
            return AuthenticationError(
                f"{address} refused our credentials for {what} ({text}); we sent "
                f"{credentials}: renew it, or check that it is meant for this server or gateway "
                "(issuer, audience)")
        return AuthenticationError(
            f"Triton at {address} refused our credentials for {what} ({text}); check the "
            "authorization header (e.g. headers={'authorization': Secret.bearer_from_env('NAME')}"
            " with NAME set here and on the workers) and TLS settings")
    if kind == "restricted":
        return ConfigurationError(
            f"Triton at {address} restricts this call for {what} ({text}); pass the server's "
            "key as TritonModel(protocol_key=('KEY', Secret.from_env('NAME'))) or the settings "
            "protocol_key_name / protocol_key_env")
    if kind == "bad_request":
        return InputValidationError(f"Triton at {address} rejected the inputs of {what}: {text}")
    if error.retryable:
        return ServerUnavailableError(f"Triton at {address} could not serve {what}: {text}")
    return InferenceError(f"Triton at {address} failed on {what}: {text}")
