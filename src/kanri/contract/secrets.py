"""What a credential Secret must hold, checked the same way by the operator (adopted Secrets, reported in status)
and by the instance manager (the mounted files, before any role is touched).

| Secret | key | rule |
|---|---|---|
| ``<cluster>-superuser`` | ``username`` | absent or ``postgres`` (the only superuser) |
| | ``password`` | required; UTF-8, one line, no NUL, 1 to 1024 bytes |
| ``<cluster>-replication`` | ``username`` | absent or ``streaming_replica`` |
| | ``password`` | as above |
| ``<cluster>-app`` | ``username`` | required; ``bootstrap.initdb.owner``; a lower-case identifier, not reserved |
| | ``password`` | as above |
| ``<cluster>-api`` | ``token`` | required; 16 to 1024 printable ASCII characters, no spaces |

A problem names the key and what is wrong, never the value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from kanri.contract.roles import IDENTIFIER_PATTERN, REPLICATION_USER, SUPERUSER, reserved_role

__all__ = ["MAX_PASSWORD_BYTES", "Purpose", "SecretProblem", "credential_problems", "token_problems"]

Purpose = Literal["superuser", "replication", "app"]
MAX_PASSWORD_BYTES = 1024
_IDENTIFIER = re.compile(IDENTIFIER_PATTERN)
_TOKEN = re.compile(r"^[\x21-\x7e]{16,1024}$")
_FIXED_USER: dict[Purpose, str] = {"superuser": SUPERUSER, "replication": REPLICATION_USER}


@dataclass(frozen=True)
class SecretProblem:
    """One thing wrong with one key of a Secret."""

    key: str
    message: str


def _text(data: Mapping[str, bytes], key: str) -> tuple[str | None, SecretProblem | None]:
    raw = data.get(key)
    if raw is None:
        return None, None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, SecretProblem(key, "is not UTF-8 text")
    return text, None


def _password_problem(data: Mapping[str, bytes]) -> SecretProblem | None:
    text, problem = _text(data, "password")
    if problem is not None:
        return problem
    if text is None:
        return SecretProblem("password", "is missing")
    text = text.rstrip("\r\n")  # one trailing newline (echo > file) is tolerated, as libpq's pwfile reader does
    if not text:
        return SecretProblem("password", "is empty")
    if any(c in text for c in "\r\n\x00"):
        return SecretProblem("password", "must be one line without NUL")
    if len(text.encode()) > MAX_PASSWORD_BYTES:
        return SecretProblem("password", f"is longer than {MAX_PASSWORD_BYTES} bytes")
    return None


def credential_problems(
    purpose: Purpose, data: Mapping[str, bytes], *, owner: str | None = None
) -> list[SecretProblem]:
    """What is wrong with a basic-auth Secret's ``data`` (decoded bytes per key); empty when it is usable.

    ``owner`` is ``bootstrap.initdb.owner`` for the app Secret (None: only the general rules are checked)."""
    problems: list[SecretProblem] = []
    username, problem = _text(data, "username")
    if problem is not None:
        problems.append(problem)
    elif purpose in _FIXED_USER:
        if username is not None and username.strip() != _FIXED_USER[purpose]:
            problems.append(SecretProblem("username", f"must be {_FIXED_USER[purpose]} (or absent)"))
    elif username is None or not username.strip():
        problems.append(SecretProblem("username", "is missing"))
    else:
        name = username.strip()
        if not _IDENTIFIER.match(name):
            problems.append(SecretProblem("username", "must be a lower-case PostgreSQL identifier (at most 63 bytes)"))
        elif reserved_role(name):
            problems.append(
                SecretProblem("username", "is a reserved role name (postgres, streaming_replica, public, pg_...)")
            )
        elif owner is not None and name != owner:
            problems.append(SecretProblem("username", f"must equal spec.bootstrap.initdb.owner ({owner})"))
    if (password := _password_problem(data)) is not None:
        problems.append(password)
    return problems


def token_problems(data: Mapping[str, bytes]) -> list[SecretProblem]:
    """What is wrong with the instance API's token Secret; empty when it is usable."""
    text, problem = _text(data, "token")
    if problem is not None:
        return [problem]
    if text is None:
        return [SecretProblem("token", "is missing")]
    if not _TOKEN.match(text.strip()):
        return [SecretProblem("token", "must be 16 to 1024 printable ASCII characters without spaces")]
    return []
