"""The mounted credential Secrets, read as bytes and checked with :mod:`kanri.contract.secrets` before any use.

A Secret can be edited past the API's rules (binary junk, ``username: postgres`` in the app Secret, an empty
password), so nothing here trusts the files: a Secret with a problem is not used, and each problem names the
Secret's purpose and the key, never the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kanri.contract.roles import REPLICATION_USER, SUPERUSER
from kanri.contract.secrets import SecretProblem, credential_problems, token_problems
from kanri.instance.config import Credentials
from kanri.instance.problems import Problem

Purpose = Literal["superuser", "replication", "app"]
_DEFAULT_USER: dict[Purpose, str] = {"superuser": SUPERUSER, "replication": REPLICATION_USER}


@dataclass(frozen=True)
class Checked:
    """One Secret after the check: its credentials (None when absent or unusable) and what is wrong with it."""

    credentials: Credentials | None
    problems: tuple[Problem, ...] = ()


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def _problem(purpose: str, problem: SecretProblem) -> Problem:
    return Problem(
        "InvalidSecret", f"{purpose} Secret: {problem.key} {problem.message}", secret=purpose, key=problem.key
    )


def check_credentials(purpose: Purpose, directory: Path) -> Checked:
    """The ``username``/``password`` files of a basic-auth Secret, checked.

    An absent app Secret is legal (no application database); the superuser's and the replication role's are
    required, so their absence is a problem too."""
    if not directory.is_dir() and purpose == "app":
        return Checked(None)
    data = {key: raw for key in ("username", "password") if (raw := _read(directory / key)) is not None}
    problems = credential_problems(purpose, data)
    if problems:
        return Checked(None, tuple(_problem(purpose, p) for p in problems))
    # the check passed: both decode, the password is one line (a trailing newline tolerated)
    username = data["username"].decode().strip() if "username" in data else _DEFAULT_USER[purpose]
    return Checked(Credentials(username, data["password"].decode().rstrip("\r\n")))


def check_token(path: Path) -> tuple[str | None, tuple[Problem, ...]]:
    """The API token file, checked: the token, or None and the problems."""
    raw = _read(path)
    problems = token_problems({} if raw is None else {"token": raw})
    if problems:
        return None, tuple(_problem("api", p) for p in problems)
    assert raw is not None
    return raw.decode().strip(), ()
