"""The problems an instance manager reports in ``GET /status`` (``problems``), as the operator reads them.

Each is ``{"reason", "message", "secret"?, "key"?, "parameter"?}``: one of :data:`REASONS`, a one-line message of at
most :data:`MAX_MESSAGE` characters that never holds a Secret's or a file's content. The operator turns each reason
into a condition of its own (an unknown reason is read as ``InstanceProblem``).
"""

from __future__ import annotations

__all__ = ["MAX_MESSAGE", "REASONS", "one_line"]

REASONS: tuple[str, ...] = (
    "InvalidSecret",
    "InvalidParameter",
    "InvalidConfig",
    "DataDirectoryLost",
    "SystemIdentifierMismatch",
    "DataVersionMismatch",
    "Fenced",
    "PostgresUnreachable",
    "DiskFull",  # kanri:disk-full
)
"""``Fenced``: the instance holds a fence marker (``POST /fence``): PostgreSQL stays stopped until ``POST /unfence``.
``PostgresUnreachable``: the manager has not been able to connect to its own running PostgreSQL for a while; the
message is the first line of libpq's connection error (a connection error never quotes SQL).
``DiskFull``: PostgreSQL failed to write for lack of space and the data volume is still short of room; the message
holds the volume's free and total bytes (:mod:`kanri.instance.disk_full`)."""

MAX_MESSAGE = 300


def one_line(text: str) -> str:
    """``text`` as one line of at most :data:`MAX_MESSAGE` characters (the form of every problem message)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_MESSAGE else flat[: MAX_MESSAGE - 1] + "…"
