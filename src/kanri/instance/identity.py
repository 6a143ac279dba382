"""Which cluster and which major a data directory belongs to, read from its files (PostgreSQL need not run).

Checked before every start of PostgreSQL: a data directory of another cluster (``systemIdentifier`` in the config
differs) or of another major (``PG_VERSION`` differs from the binaries) must not be started — the first would serve
the wrong data as if nothing happened, the second fails or worse.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from kanri.instance.config import ClusterConfig
from kanri.instance.problems import Problem


def data_version(pgdata: Path) -> int | None:
    """The major version in ``PG_VERSION`` (``15``), or None when there is none."""
    try:
        raw = (pgdata / "PG_VERSION").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(raw) if raw.isdigit() else None


def system_identifier(pgdata: Path) -> str | None:
    """The system identifier from ``global/pg_control`` as a decimal string, or None when unreadable.

    It is the control file's first field (a uint64 in the machine's byte order) in every major since 8.x."""
    try:
        with (pgdata / "global" / "pg_control").open("rb") as handle:
            head = handle.read(8)
    except OSError:
        return None
    return str(int.from_bytes(head, sys.byteorder)) if len(head) == 8 else None


async def binary_version(postgres: str) -> int | None:
    """The major of the ``postgres`` binary (``postgres (PostgreSQL) 15.10 ...`` → 15), or None."""
    try:
        proc = await asyncio.create_subprocess_exec(
            postgres, "--version", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
    except OSError:
        return None
    out, _ = await proc.communicate()
    match = re.search(r"\(PostgreSQL\)\s+(\d+)", out.decode(errors="replace"))
    return int(match[1]) if match else None


def start_problems(pgdata: Path, config: ClusterConfig, binaries: int | None) -> list[Problem]:
    """Why the data directory must not be started with these binaries under this config (empty: it may)."""
    problems: list[Problem] = []
    data = data_version(pgdata)
    if data is not None and binaries is not None and data != binaries:
        problems.append(
            Problem(
                "DataVersionMismatch",
                f"the data directory is PostgreSQL {data} but the binaries are PostgreSQL {binaries}; not starting",
            )
        )
    expected = config.system_identifier
    if expected is not None:
        found = system_identifier(pgdata)
        if found != expected:
            problems.append(
                Problem(
                    "SystemIdentifierMismatch",
                    f"the data directory belongs to system {found or 'unknown'}, the cluster is {expected}; "
                    "not starting",
                )
            )
    return problems
