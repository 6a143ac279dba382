"""The names the operator derives from a DatabaseInstance: the same object always yields the same names, so a
repeated create finds what an earlier one made."""

from __future__ import annotations

import hashlib
import re

__all__ = ["connection_secret", "final_snapshot_id", "identifier"]

_LIMIT = 63  # RDS DBInstanceIdentifier: 1-63 letters, digits, hyphens; a letter first; no "--"; no hyphen last
_NOT_ALLOWED = re.compile(r"[^a-z0-9-]+")


def _clean(text: str) -> str:
    return re.sub(r"-{2,}", "-", _NOT_ALLOWED.sub("-", text.lower())).strip("-")


def identifier(namespace: str, name: str) -> str:
    """``kanri-<namespace>-<name>``, cut to RDS's 63 characters with a hash of the full name when too long (two
    objects never share an identifier: the hash tells long names apart)."""
    full = _clean(f"kanri-{namespace}-{name}")
    if len(full) <= _LIMIT:
        return full
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:10]
    return f"{full[: _LIMIT - len(digest) - 1].rstrip('-')}-{digest}"


def final_snapshot_id(identifier_: str, uid: str) -> str:
    """The final snapshot's name: per object (uid), so a later object of the same name never collides with it."""
    return _clean(f"{identifier_}-final-{uid[:8]}")


def connection_secret(name: str) -> str:
    """The Secret applications read: ``<name>-connection``."""
    return f"{name}-connection"
