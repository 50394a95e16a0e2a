"""What :class:`~coffea_sonic.model.TritonModel` accepts: its options checked, settings read.

One rule per option, shared with the settings, with examples: docs/internals/client.md.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Iterable, Mapping, Sequence

from . import config
from .core.endpoint import ModelRef, ServerSettings, configured_tls, parse_model_url
from .core.tls import TlsOptions
from .errors import ConfigurationError
from .transport.kinds import REQUESTABLE
from .validation import GRPC_MESSAGE_LIMIT, NONFINITE_POLICIES

__all__ = ["DEFAULT_CONNECT_TIMEOUT_S", "DEFAULT_NONFINITE", "check_limits", "checked_setting",
           "checked_transport", "parse_urls", "resolve_connect_timeout", "resolve_nonfinite",
           "resolve_tls", "unknown_keywords"]

#: how long a server gets to answer at all before it counts as down (setting ``connect_timeout_s``)
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: NaN/inf in inputs: warned about once per model and tensor (setting ``nonfinite``)
DEFAULT_NONFINITE = "warn"


def unknown_keywords(owner: str, given: Mapping[str, Any], known: Iterable[str]) -> None:
    """Raise ``ConfigurationError`` for keywords of ``given`` that ``owner`` does not take,
    naming the closest real one (a TypeError from Python would name none)."""
    if not given:
        return
    known = sorted(known)
    name = sorted(given)[0]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    if not close:
        close = [k for k in known if name in k or k in name][:1]
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigurationError(f"{owner} got an unknown keyword {name!r}{hint} "
                             f"(its keywords: {', '.join(known)})")


def resolve_connect_timeout(value: Any) -> float:
    """``value``, or the ``connect_timeout_s`` setting (default 10 s), as seconds > 0."""
    if value is None:
        value = config.setting("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0:
        raise ConfigurationError(f"connect_timeout_s must be > 0 seconds, not {value!r}")
    return seconds


def resolve_nonfinite(value: Any) -> str:
    """``value``, or the ``nonfinite`` setting (default ``"warn"``): pass, warn or raise."""
    if value is None:
        value = config.setting("nonfinite", DEFAULT_NONFINITE)
    policy = str(value).strip().lower() if isinstance(value, str) else value
    if policy not in NONFINITE_POLICIES:
        raise ConfigurationError(
            f"nonfinite must be one of {', '.join(map(repr, NONFINITE_POLICIES))}, not {value!r}")
    return policy


def checked_transport(transport: str | Callable[[ServerSettings], Any] | None
                      ) -> str | Callable[[ServerSettings], Any]:
    """The transport asked for (None: the ``transport`` setting, default ``"auto"``)."""
    if transport is None:
        transport = str(config.setting("transport", "auto")).strip().lower()
    if not callable(transport) and transport not in REQUESTABLE:
        raise ConfigurationError(
            f"transport must be one of {', '.join(map(repr, REQUESTABLE))} or a factory "
            f"f(ServerSettings) -> Transport, not {transport!r}")
    return transport


def parse_urls(urls: Sequence[str]) -> list[ModelRef]:
    """The model references of ``urls``: one model and version, each server once."""
    if not urls:
        raise ConfigurationError("TritonModel needs at least one URL")
    refs = [parse_model_url(u) for u in urls]
    first = refs[0]
    for ref, text in zip(refs, urls):
        if (ref.model, ref.version) != (first.model, first.version):
            raise ConfigurationError(
                f"all URLs of one TritonModel must name the same model and version: "
                f"{urls[0]!r} vs {text!r}")
    if len({(ref.protocol, ref.address) for ref in refs}) != len(refs):
        raise ConfigurationError(f"a server is listed twice in {list(urls)}")
    return refs


def check_limits(timeout_s: Any, max_in_flight: Any, max_request_bytes: Any,
                 priority: Any) -> None:
    """Raise ``ConfigurationError`` for a number out of its range."""
    if timeout_s is None or not timeout_s > 0:
        raise ConfigurationError(f"timeout_s must be > 0 seconds, not {timeout_s!r}")
    if max_in_flight is not None and (not isinstance(max_in_flight, int) or max_in_flight < 1):
        raise ConfigurationError(f"max_in_flight must be an int >= 1, not {max_in_flight!r}")
    if max_request_bytes is not None and (not isinstance(max_request_bytes, int) or not (
            1 <= max_request_bytes <= GRPC_MESSAGE_LIMIT - (1 << 20))):
        raise ConfigurationError(
            "max_request_bytes must be an int between 1 and gRPC's 2 GiB message limit "
            f"(less 1 MiB framing), not {max_request_bytes!r}")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                 or priority < 1):
        raise ConfigurationError(f"priority must be an int >= 1 (1 is served first) or None, "
                                 f"not {priority!r}")


def resolve_tls(ssl: Any, refs: Sequence[ModelRef], urls: Sequence[str]
                ) -> tuple[TlsOptions | None, list[TlsOptions | None]]:
    """The model's TLS options (its first server's) and each server's."""
    tls = TlsOptions.coerce(ssl)
    if ssl is False and any(ref.tls for ref in refs):
        raise ConfigurationError(f"{list(urls)} ask for TLS (triton+grpcs) but ssl=False")
    url_tls = configured_tls() if tls is None and any(r.tls for r in refs) else None
    per_server = [tls if tls is not None else (url_tls if ref.tls else None) for ref in refs]
    return per_server[0], per_server


def _on_off(value: Any) -> str:
    text = str(value).strip().lower()
    if text in ("on", "true", "yes", "1"):
        return "on"
    if text in ("off", "false", "no", "0", "none"):
        return "off"
    raise ConfigurationError(f"must be on or off, not {value!r}")


def _checks() -> dict[str, Callable[[Any], Any]]:
    """Each checked setting's rule: the one TritonModel (or the code reading it) applies."""
    from .fallback import resolve_fallback
    from .shadow import resolve_shadow
    from .transport.compression import configured_compression

    return {"connect_timeout_s": resolve_connect_timeout, "nonfinite": resolve_nonfinite,
            "transport": checked_transport, "fallback": resolve_fallback,
            "shadow": resolve_shadow, "compression": configured_compression,
            "preflight": _on_off}


def checked_setting(name: str, value: Any) -> Any:
    """``value`` for setting ``name`` as the code that reads it takes it, or a
    ``ConfigurationError`` naming the setting (``coffea-sonic config --set`` checks with this)."""
    check = _checks().get(name)
    if check is None or value is None:
        return value
    try:
        return check(value)
    except ConfigurationError as error:
        raise ConfigurationError(f"setting {name}: {error}") from None
