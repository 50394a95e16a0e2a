"""Classify gRPC failures: which are worth retrying (elsewhere), and which our error they become.

Retried: the server is gone or restarting (``UNAVAILABLE``, connection resets), too slow
(``DEADLINE_EXCEEDED``), or overloaded (``RESOURCE_EXHAUSTED``, Triton's "Exceeds maximum queue
size"). Never retried: ``INVALID_ARGUMENT``, ``NOT_FOUND`` and every other answer that would be
the same on any server.

>>> import grpc
>>> is_retryable_code(grpc.StatusCode.UNAVAILABLE), is_retryable_code(grpc.StatusCode.NOT_FOUND)
(True, False)
"""

from __future__ import annotations

from ..errors import (ConfigurationError, InferenceError, InputValidationError, ModelNotFoundError,
                      ServerUnavailableError, SonicError)

__all__ = ["TRANSIENT_MESSAGES", "as_sonic_error", "describe", "is_retryable", "is_retryable_code",
           "server_outcome"]

#: Fragments of error details that mean "this server, right now" even under a generic status code.
TRANSIENT_MESSAGES: tuple[str, ...] = (
    "connection reset", "socket closed", "broken pipe", "stream removed", "rst_stream",
    "goaway", "endpoint read failed", "failed to connect", "connection refused",
    "stub process is not healthy", "exceeds maximum queue size", "server is not ready",
    "shutting down",
)


def _code_name(code) -> str:
    return getattr(code, "name", str(code))


def is_retryable_code(code, details: str = "") -> bool:
    """Whether a failure with gRPC status ``code`` (and ``details``) may succeed if sent again."""
    name = _code_name(code)
    if name in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"):
        return True
    if name in ("UNKNOWN", "INTERNAL", "CANCELLED"):
        lowered = details.lower()
        return any(fragment in lowered for fragment in TRANSIENT_MESSAGES)
    return False


def is_retryable(error: BaseException) -> bool:
    """Whether ``error`` (a ``grpc.RpcError`` or ours) may succeed if sent again, maybe elsewhere."""
    if isinstance(error, SonicError):
        return isinstance(error, ServerUnavailableError)
    code = getattr(error, "code", None)
    if not callable(code):
        return False
    return is_retryable_code(code(), error.details() or "")


def server_outcome(error: BaseException) -> str:
    """What a failure says about the server: ``busy`` (overloaded: back off), ``down`` (gone,
    restarting or too slow: quarantine it), or ``other`` (it answered; the request was the problem).

    >>> import grpc
    >>> class E(grpc.RpcError):
    ...     def __init__(self, code, details): self._c, self._d = code, details
    ...     def code(self): return self._c
    ...     def details(self): return self._d
    >>> server_outcome(E(grpc.StatusCode.UNAVAILABLE, "Exceeds maximum queue size"))
    'busy'
    >>> server_outcome(E(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"))
    'down'
    >>> server_outcome(E(grpc.StatusCode.INVALID_ARGUMENT, "bad shape"))
    'other'
    """
    code = getattr(error, "code", None)
    if not callable(code):
        return "down" if isinstance(error, ServerUnavailableError) else "other"
    name = _code_name(code())
    details = (error.details() or "").lower()
    if name == "RESOURCE_EXHAUSTED" or "queue size" in details or "too many" in details:
        return "busy"
    if is_retryable_code(code(), details):
        return "down"
    return "other"


def describe(error: BaseException) -> str:
    """``"UNAVAILABLE: details"`` for a gRPC error, ``str(error)`` otherwise."""
    code = getattr(error, "code", None)
    if callable(code):
        details = (error.details() or "").strip()
        return f"{_code_name(code())}: {details}" if details else _code_name(code())
    return f"{type(error).__name__}: {error}"


def as_sonic_error(error: BaseException, *, model: str, version: str, address: str) -> SonicError:
    """Our exception for a gRPC error from ``address`` while serving ``model``/``version``."""
    if isinstance(error, SonicError):
        return error
    what = f"model {model!r}" + (f" version {version}" if version else "")
    code = getattr(error, "code", None)
    name = _code_name(code()) if callable(code) else ""
    text = describe(error)
    if name == "NOT_FOUND":
        return ModelNotFoundError(f"Triton at {address} does not serve {what} ({text})")
    if name in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return ConfigurationError(
            f"Triton at {address} refused our credentials for {what} ({text}); check the "
            "authorization header (e.g. headers={'authorization': Secret.bearer_from_env('NAME')}"
            " with NAME set here and on the workers) and TLS settings")
    if name == "INVALID_ARGUMENT":
        return InputValidationError(f"Triton at {address} rejected the inputs of {what}: {text}")
    if is_retryable(error):
        return ServerUnavailableError(f"Triton at {address} could not serve {what}: {text}")
    return InferenceError(f"Triton at {address} failed on {what}: {text}")
