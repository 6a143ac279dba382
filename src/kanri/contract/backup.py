"""What the operator and the instance manager agree on about backups: the file names of the repository's key pair
in the Secret the operator copies for the instances (``<cluster>-backup-credentials``, mounted at
``/etc/kanri/backup``), and the bodies of the backup endpoints (``POST /backups`` and ``GET /backups/{id}`` answer a
:class:`BackupRecord`, ``POST /backups/expire`` an :class:`Expired`, ``POST /backups/catalogue`` a
:class:`Catalogue`, ``POST /wal/switch`` a :class:`WalSwitched`).

Every field of these answers is always sent, in the order declared (the order instances have always sent). The
operator reads them with ``read``: None for a body that is not one, each value defensively
(:mod:`kanri.contract.wire`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, ValidationError

from kanri.contract.wire import UNTRUSTED, Count, Name, Text, Wire, reading

__all__ = [
    "ACCESS_KEY_FILE",
    "SECRET_KEY_FILE",
    "BackupRecord",
    "Catalogue",
    "CatalogueEntry",
    "Expired",
    "Phase",
    "WalSwitched",
]

ACCESS_KEY_FILE = "ACCESS_KEY_ID"
SECRET_KEY_FILE = "ACCESS_SECRET_KEY"

Phase = Literal["Running", "Completed", "Failed"]
PHASES: tuple[Phase, ...] = ("Running", "Completed", "Failed")


def _read(cls: type[Wire], body: object) -> Any:
    try:
        return cls.model_validate(body, context=UNTRUSTED)
    except ValidationError:
        return None


class BackupRecord(Wire):
    """One backup id's state (``GET /backups/{id}``), also what the instance keeps on its volume for that id.
    Mutable: the instance fills it in while the backup runs."""

    model_config = ConfigDict(frozen=False)

    id: str
    """The operator's idempotency key (a PostgresBackup's uid)."""
    phase: Phase
    started_at: Annotated[str, reading(lambda v: v if isinstance(v, str) else "")] = ""
    completed_at: Name = None
    backup_id: Name = None
    """Barman's id (``YYYYMMDDThhmmss``)."""
    begin_time: Name = None
    end_time: Name = None
    begin_wal: Name = None
    end_wal: Name = None
    begin_lsn: Name = None
    end_lsn: Name = None
    size_bytes: Count = None
    timeline: Count = None
    from_standby: Annotated[bool | None, reading(lambda v: v if isinstance(v, bool) else None)] = None
    error: Text = None

    @classmethod
    def read(cls, body: object) -> BackupRecord | None:
        """The record in a body from the network, or None when it is not one (no id, an unknown phase)."""
        if not isinstance(body, dict) or body.get("phase") not in PHASES or not isinstance(body.get("id"), str):
            return None
        record: BackupRecord | None = _read(cls, body)
        return record


class Expired(Wire):
    """``POST /backups/expire``: the barman ids deleted (an id already gone counts), and those that failed with
    barman's message."""

    deleted: list[str]
    failed: dict[str, str]

    @classmethod
    def read(cls, body: object) -> Expired | None:
        """The answer in a body from the network; entries of the wrong type are left out."""
        if not isinstance(body, dict):
            return None
        deleted = body.get("deleted")
        failed = body.get("failed")
        return cls(
            deleted=[i for i in deleted if isinstance(i, str)] if isinstance(deleted, list) else [],
            failed={str(k): str(v) for k, v in failed.items()} if isinstance(failed, dict) else {},
        )


class CatalogueEntry(Wire):
    """One backup of the repository as Barman Cloud's catalogue lists it (``barman-cloud-backup-list``)."""

    backup_id: Name = None
    """Barman's id (``YYYYMMDDThhmmss``)."""
    status: Name = None
    """Barman's status: ``DONE`` for a complete backup (also ``FAILED``, ``STARTED``, ...)."""
    end_time: Name = None
    """When it ended, ISO 8601 with its offset (barman's ``end_time_iso``); None for one that never ended."""
    name: Name = None
    """Barman's ``--name`` of it (the operator names its backups after the PostgresBackup's uid)."""


class Catalogue(Wire):
    """``POST /backups/catalogue {"serverName"?}``: every backup of one system in the repository, whether or not an
    operator recorded it."""

    backups: list[CatalogueEntry]

    @classmethod
    def read(cls, body: object) -> Catalogue | None:
        """The catalogue in a body from the network; entries that are not one are left out."""
        if not isinstance(body, dict) or not isinstance(body.get("backups"), list):
            return None
        entries = [_read(CatalogueEntry, item) for item in body["backups"] if isinstance(item, dict)]
        return cls(backups=[e for e in entries if e is not None])


class WalSwitched(Wire):
    """``POST /wal/switch``: the WAL segment just closed (archived next)."""

    segment: str

    @classmethod
    def read(cls, body: object) -> WalSwitched | None:
        if not isinstance(body, dict) or not isinstance(body.get("segment"), str):
            return None
        switched: WalSwitched | None = _read(cls, body)
        return switched
