"""Tokens an attacker makes, who has the gateway's public key and a token of their own: the
gateway (``coffea_sonic.netlab.gateway``, HAProxy with ``deploy/haproxy/gateway.cfg``) must refuse
every one (``tests/test_gateway.py``).

>>> claims(with_claims(unsigned({"sub": "mallory"}), sub="alice"))
{'sub': 'alice'}
"""

from __future__ import annotations

import hashlib
import hmac

from coffea_sonic.netlab.tokens import _encode, claims


def sign_hs256(body: dict, secret: bytes | str) -> str:
    """A token for claims ``body`` signed HS256 with ``secret``: the key-confusion attack, with the
    gateway's *public* key (its PEM text, or the path it is configured with) as the HMAC secret.

    >>> claims(sign_hs256({"sub": "mallory"}, b"the gateway's key"))
    {'sub': 'mallory'}
    """
    key = secret.encode() if isinstance(secret, str) else secret
    signed = f"{_encode({'alg': 'HS256', 'typ': 'JWT'})}.{_encode(body)}"
    return f"{signed}.{_encode(hmac.new(key, signed.encode(), hashlib.sha256).digest())}"


def unsigned(body: dict, alg: str = "none") -> str:
    """A token for claims ``body`` that says it is ``alg`` (``none``: not signed) and has an
    empty signature part.

    >>> unsigned({"sub": "mallory"}).endswith(".")
    True
    """
    return f"{_encode({'alg': alg, 'typ': 'JWT'})}.{_encode(body)}."


def without_signature(token: str) -> str:
    """``token`` as header and payload alone, its signature part dropped (no trailing dot).

    >>> without_signature("h.p.s")
    'h.p'
    """
    return ".".join(token.split(".")[:2])


def with_claims(token: str, **changes) -> str:
    """``token`` with its payload edited after signing (claims in ``changes`` replaced, e.g.
    another ``sub`` or a later ``exp``), header and signature kept as they were."""
    header, _, signature = token.split(".")
    return f"{header}.{_encode({**claims(token), **changes})}.{signature}"
