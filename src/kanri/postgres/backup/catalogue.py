"""Retention over the whole repository, the pure part: the backups Barman Cloud's catalogue holds that no
PostgresBackup records, and the backups a restore under way still needs.

A base backup can be in the repository without a PostgresBackup object: taken by hand with ``barman-cloud-backup``,
or recorded by an object someone deleted (deleting a PostgresBackup leaves its backup in the store). Retention
counts them with the recorded ones (:func:`kanri.postgres.backup.plan.expired` over both), so a forgotten backup
neither stays forever nor shifts the recovery window: the window keeps whichever backups it needs, recorded or not.

What is never expired, whatever the window says: a backup a restore under way needs — a PostgresCluster of the
namespace bootstrapping from this cluster (``spec.bootstrap.recovery.source``) that has not finished yet (no
``status.systemIdentifier``) restores the backup it names (``backup``), else the newest that ended before its
``targetTime``, else the newest of all (which retention keeps anyway).

Only complete backups (barman's status ``DONE`` with an end time) count; one still running or failed is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kanri.contract.backup import CatalogueEntry
from kanri.postgres.backup.plan import Done, parse_time

__all__ = ["needed_by_restores", "unrecorded"]

Obj = dict[str, Any]


def unrecorded(entries: Iterable[CatalogueEntry], server: str, recorded: Iterable[Done]) -> list[Done]:
    """The complete backups of ``server`` in the catalogue that no PostgresBackup in ``recorded`` names, as retention
    sees them (no object name), oldest first."""
    known = {(d.server, d.backup_id) for d in recorded}
    found: list[Done] = []
    for entry in entries:
        ended = parse_time(entry.end_time)
        if entry.status != "DONE" or not entry.backup_id or ended is None or (server, entry.backup_id) in known:
            continue
        found.append(Done("", entry.backup_id, ended, server))
    return sorted(found, key=lambda d: (d.ended, d.backup_id))


def needed_by_restores(clusters: Iterable[Obj], source: str, backups: Sequence[Done]) -> set[str]:
    """The barman ids among ``backups`` that a restore from ``source`` not finished yet needs (see the module)."""
    needed: set[str] = set()
    for cluster in clusters:
        recovery = ((cluster.get("spec") or {}).get("bootstrap") or {}).get("recovery") or {}
        if recovery.get("source") != source or (cluster.get("status") or {}).get("systemIdentifier"):
            continue
        if named := recovery.get("backup"):
            needed.add(str(named))
            continue
        target = parse_time(recovery.get("targetTime"))
        usable = [d for d in backups if target is None or d.ended <= target]
        if usable:
            needed.add(max(usable, key=lambda d: (d.ended, d.backup_id)).backup_id)
    return needed
