"""The bodies of the actions an operator asks an instance manager for over HTTP, declared once for both sides.

Requests (``POST /fence``'s reason, ``POST /backups``' id) and the answers of the actions that change PostgreSQL's
role or state. Every field of an answer is always sent (:meth:`Wire.as_json`), in the
order declared, which is the order instances have always sent. The operator reads an answer with its ``read``: None
when the instance did not do what was asked (the flag is not ``true``), otherwise each value defensively
(:mod:`kanri.contract.wire`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from pydantic import ValidationError

from kanri.contract.wire import UNTRUSTED, Count, Flag, Name, Text, Wire

__all__ = [
    "BackupRequest",
    "Demoted",
    "FenceRequest",
    "Fenced",
    "Paused",
    "Promoted",
    "RejoinAccepted",
    "Restarted",
    "Resumed",
    "Unfenced",
]


class _Answer(Wire):
    """An action's answer; :attr:`DONE` is the key and value that say the action was done."""

    DONE: ClassVar[tuple[str, object]] = ("", None)

    @classmethod
    def read(cls, body: object) -> Self | None:
        """The answer in a body from the network, or None when it does not say the action was done."""
        key, value = cls.DONE
        if not isinstance(body, dict) or key not in body or body[key] is not value:
            return None
        try:
            return cls.model_validate(body, context=UNTRUSTED)
        except ValidationError:
            return None


class Promoted(_Answer):
    """``POST /promote``: the replica is the primary now, on ``timeline``, writing at ``lsn``."""

    DONE = ("promoted", True)
    promoted: Literal[True] = True
    timeline: Count = None
    lsn: Name = None


class Demoted(_Answer):
    """``POST /demote``: the primary shut down cleanly at ``checkpoint_lsn`` and restarts as a replica."""

    DONE = ("demoted", True)
    demoted: Literal[True] = True
    checkpoint_lsn: Name = None
    timeline: Count = None


class Paused(_Answer):
    """``POST /replication/pause``: where the replica's WAL receiver stopped."""

    DONE = ("paused", True)
    paused: Literal[True] = True
    receive_lsn: Name = None
    replay_lsn: Name = None
    timeline: Count = None


class Resumed(_Answer):
    """``POST /replication/resume`` (``resumed``: a pause was lifted; False: nothing was paused)."""

    DONE = ("paused", False)
    paused: Literal[False] = False
    resumed: Flag = False


class Fenced(_Answer):
    """``POST /fence``: the marker's record; ``already``: it was fenced before; ``stopped``: this call stopped a
    running PostgreSQL."""

    DONE = ("fenced", True)
    fenced: Literal[True] = True
    since: Text = None
    reason: Text = None
    already: Flag = False
    stopped: Flag = False


class Unfenced(_Answer):
    """``POST /unfence`` (``lifted``: there was a marker)."""

    DONE = ("fenced", False)
    fenced: Literal[False] = False
    lifted: Flag = False


class Restarted(_Answer):
    """``POST /restart``: PostgreSQL takes connections again; ``pending_restart``: parameters still wait."""

    DONE = ("restarted", True)
    restarted: Literal[True] = True
    pending_restart: Flag = False


class RejoinAccepted(_Answer):
    """``POST /rejoin`` (202): the rejoin ``started`` now, or one is ``running`` already."""

    rejoin: Literal["started", "running"]

    @classmethod
    def read(cls, body: object) -> Self | None:
        if not isinstance(body, dict) or body.get("rejoin") not in ("started", "running"):
            return None
        return cls.model_validate(body, context=UNTRUSTED)


class FenceRequest(Wire):
    """``POST /fence``'s body (``reason``: one line, cut to 200 characters by the instance)."""

    reason: str | None = None

    @classmethod
    def read(cls, body: dict[str, Any]) -> FenceRequest:
        """The request in a JSON object body; a missing or empty reason reads as None."""
        reason = body.get("reason")
        return cls(reason=str(reason) if reason else None)


class BackupRequest(Wire):
    """``POST /backups``' body: ``id``, the backup's idempotency key (a PostgresBackup's uid)."""

    id: str
