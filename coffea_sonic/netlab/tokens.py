"""RS256 JSON Web Tokens for the lab's gateway, signed with ``openssl`` (no Python crypto needed).

Who holds which key: docs/internals/netlab.md, "Tokens".

>>> claims(_encode({"sub": "alice"}) + "." + _encode({"aud": "x"}) + ".sig")
{'aud': 'x'}
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path

from ..errors import NetworkLabError
from .processes import CommandUnavailableError


def _encode(document: dict | bytes) -> str:
    raw = document if isinstance(document, bytes) else json.dumps(
        document, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def claims(token: str) -> dict:
    """The (unverified) claims of ``token``: for tests and logs of subjects, never for trust."""
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def _openssl(*args: str, data: bytes | None = None) -> bytes:
    try:
        result = subprocess.run(["openssl", *args], input=data, capture_output=True, check=False)
    except FileNotFoundError:
        raise CommandUnavailableError("signing tokens needs the openssl command "
                                      "(Debian: apt-get install -y openssl)") from None
    if result.returncode != 0:
        raise NetworkLabError(f"openssl {args[0]} failed: {result.stderr.decode(errors='replace')}")
    return result.stdout


class TokenIssuer:
    """An RSA key pair in ``directory`` (made once) that signs RS256 tokens."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.private_key = self.directory / "issuer.key"
        self.public_key = self.directory / "issuer.pub.pem"
        if not self.private_key.exists():
            _openssl("genrsa", "-out", str(self.private_key), "2048")
            os.chmod(self.private_key, 0o600)
        if not self.public_key.exists():
            _openssl("rsa", "-in", str(self.private_key), "-pubout", "-out", str(self.public_key))

    def __repr__(self) -> str:
        return f"TokenIssuer(public_key={str(self.public_key)!r})"

    def claims_for(self, subject: str | None, *, audience: str = "coffea-sonic",
                   ttl_s: float = 3600, extra: dict | None = None) -> dict:
        """The claims :meth:`issue` signs: for ``subject`` (None: no ``sub`` claim), valid
        ``ttl_s`` from now (negative: already expired), ``extra`` added."""
        now = int(time.time())
        body: dict = {"iss": "coffea-sonic-netlab", "aud": audience, "iat": now,
                      "exp": now + int(ttl_s)}
        if subject is not None:
            body["sub"] = subject
        body.update(extra or {})
        return body

    def issue(self, subject: str | None, **options) -> str:
        """A token signed RS256 for :meth:`claims_for` ``(subject, **options)``."""
        body = self.claims_for(subject, **options)
        signed = f"{_encode({'alg': 'RS256', 'typ': 'JWT'})}.{_encode(body)}"
        signature = _openssl("dgst", "-sha256", "-sign", str(self.private_key),
                             data=signed.encode())
        return f"{signed}.{_encode(signature)}"

    def write(self, path: str | os.PathLike, subject: str | None, **options) -> Path:
        """Issue a token and write it to ``path`` (mode 0600), which ``token_file`` can name."""
        path = Path(path)
        path.write_text(self.issue(subject, **options))
        os.chmod(path, 0o600)
        return path
