"""A SCRAM-SHA-256 verifier (RFC 5802/7677), as PostgreSQL stores it: the operator sends only this to the instance.

The password is one the operator generated (URL-safe ASCII), so SASLprep leaves it unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

__all__ = ["ITERATIONS", "verifier"]

ITERATIONS = 4096
"""PostgreSQL's default ``scram_iterations``."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def verifier(password: str, *, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    """``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`` for ``password`` (a fresh salt when None)."""
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    return f"SCRAM-SHA-256${iterations}:{_b64(salt)}${_b64(stored_key)}:{_b64(server_key)}"
