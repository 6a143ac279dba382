"""SCRAM-SHA-256 verifiers as PostgreSQL stores them (RFC 5802/7677): ``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:
<ServerKey>``, computed here for both sides.

The operator sends a verifier instead of a password (the connection pooler's lookup role, :mod:`kanri.contract.pooler`);
the instance manager keeps a role's verifier when it already verifies the password, since a new salt for the same
password would break the keys a connection pooler derived from the old one (SCRAM pass-through). Passwords the
operator generates are URL-safe ASCII, which SASLprep leaves unchanged; for any other password :func:`verifies` may
answer False, and the caller sets a new verifier as before.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re

__all__ = ["ITERATIONS", "verifier", "verifies"]

ITERATIONS = 4096
"""PostgreSQL's default ``scram_iterations``."""
_STORED = re.compile(r"^SCRAM-SHA-256\$(\d+):([^$]+)\$([^:]+):(.+)$")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def verifier(password: str, *, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    """The verifier of ``password`` (a fresh 16-byte salt when None)."""
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    return f"SCRAM-SHA-256${iterations}:{_b64(salt)}${_b64(stored_key)}:{_b64(server_key)}"


def verifies(stored: str | None, password: str) -> bool:
    """Whether ``stored`` (a role's ``rolpassword``) is a SCRAM-SHA-256 verifier of ``password``."""
    match = _STORED.match(stored or "")
    if match is None or not 1 <= int(match.group(1)) <= 10_000_000:
        return False
    try:
        salt = base64.b64decode(match.group(2), validate=True)
    except binascii.Error:
        return False
    return hmac.compare_digest(verifier(password, salt=salt, iterations=int(match.group(1))), stored or "")
