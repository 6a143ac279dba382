"""Base backups, the pure part: names, the schedule, who goes first, where a backup is taken, what retention expires,
and what the cluster's status says about its backups. No I/O here; the executors are
:mod:`kanri.postgres.backup.controller` (one PostgresBackup) and :mod:`kanri.postgres.backup.schedule` (the cluster's
side).

- Names are deterministic (``<cluster>-initial``, ``<cluster>-<yyyymmddhhmm>`` for a schedule slot), so an operator
  that restarts between creating a backup and recording it finds the object (409) and never makes a second one.
- One at a time per cluster: of the cluster's backups not yet finished, only the first in line (oldest creation,
  then name) may run; the others wait Pending, reason ``WaitingForBackup``. The rule needs no lock: every worker
  reaches the same answer from the same objects.
- Retention is a recovery window: every completed backup that ended inside the last ``retentionDays`` is kept, and
  so is the newest one that ended before the window (the base a restore to the window's first moment starts from);
  the newest completed backup is always kept. Everything older is expired.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cronsim import CronSim, CronSimError

from kanri.runtime import parse_optional_time

__all__ = [
    "INITIAL",
    "PRE_UPGRADE",
    "TERMINAL",
    "TRIGGER_LABEL",
    "Done",
    "Summary",
    "choose_source",
    "completed",
    "expired",
    "first_in_line",
    "idempotency_id",
    "initial_name",
    "latest_slot",
    "parse_time",
    "scheduled_name",
    "summary",
]

Obj = dict[str, Any]
TRIGGER_LABEL = "kanri.dev/backup-trigger"
"""``initial``, ``schedule`` or ``pre-upgrade`` on the backups the operator creates (a user's own carry none)."""
INITIAL = "initial"
PRE_UPGRADE = "pre-upgrade"
TERMINAL = frozenset({"Completed", "Failed"})
MAX_LAG_BYTES = 64 * 1024 * 1024
"""A replica further behind than this is not "healthy" for a backup: it would miss recent writes until it catches
up (the backup is consistent only once its end WAL is replayed anyway, so this is about freshness, not safety)."""


def parse_time(raw: Any) -> datetime | None:
    """An ISO 8601 time from the API (``Z`` or an offset) as an aware datetime, or None."""
    if isinstance(raw, datetime):
        return raw if raw.tzinfo else raw.replace(tzinfo=UTC)
    if not isinstance(raw, str):
        return None
    try:
        return parse_optional_time(raw)
    except ValueError:  # not RFC 3339 (a zone is required): treated as absent
        return None


def initial_name(cluster: str, server: str | None = None) -> str:
    """The first backup of a PostgreSQL system, asked for as soon as the cluster is Ready: ``<cluster>-initial``,
    and ``<cluster>-pg<major>-initial`` for the system a major upgrade made (``server``: its server name)."""
    if server is None or server == cluster:
        return f"{cluster}-{INITIAL}"
    return f"{server.replace('.', '-')}-{INITIAL}"


def scheduled_name(cluster: str, slot: datetime) -> str:
    """The backup of one schedule slot (minute precision, UTC: a cron schedule has no finer slots)."""
    return f"{cluster}-{slot.astimezone(UTC):%Y%m%d%H%M}"


def idempotency_id(uid: str) -> str:
    """The id the instance manager keys a backup by: the PostgresBackup's uid (a retried request, or the same
    object seen by a restarted operator, names the same backup; a deleted and recreated object gets a new one)."""
    return uid.lower()


def latest_slot(schedule: str, since: datetime, now: datetime) -> datetime | None:
    """The latest moment of ``schedule`` (cron, UTC) in ``(since, now]``, or None (none yet, or a schedule cronsim
    refuses). Missed slots are not made up: one backup for the latest is enough, the older ones would be expired."""
    try:
        # reverse iteration yields moments strictly before its start: start one second after now to include now
        moment: datetime = next(CronSim(schedule, (now + timedelta(seconds=1)).astimezone(UTC), reverse=True))
    except (CronSimError, StopIteration):
        return None
    return moment if moment > since else None


def _key(backup: Obj) -> tuple[str, str]:
    meta = backup["metadata"]
    return (str(meta.get("creationTimestamp") or ""), str(meta["name"]))


def first_in_line(backups: Iterable[Obj]) -> Obj | None:
    """Of one cluster's backups, the unfinished one that may run: one already Running, else the oldest asked for."""
    waiting = [b for b in backups if (b.get("status") or {}).get("phase") not in TERMINAL]
    running = [b for b in waiting if (b.get("status") or {}).get("phase") == "Running"]
    chosen = sorted(running or waiting, key=_key)
    return chosen[0] if chosen else None


def choose_source(instances: Sequence[Mapping[str, Any]], primary: str | None) -> str | None:
    """Where to take the backup (from ``status.instances``): a ready replica that reports its lag (it streams from
    the primary) and is not far behind (it spares the primary the reading), else the primary when it is ready; None
    when neither."""
    replicas = sorted(
        str(i["name"]) for i in instances
        if i.get("role") == "Replica" and i.get("ready") is True
        and isinstance(i.get("lagBytes"), int) and i["lagBytes"] <= MAX_LAG_BYTES
    )  # fmt: skip
    if replicas:
        return replicas[0]
    ready_primary = any(i.get("name") == primary and i.get("role") == "Primary" and i.get("ready") is True
                        for i in instances)  # fmt: skip
    return primary if ready_primary else None


@dataclass(frozen=True)
class Done:
    """A completed backup as retention sees it."""

    name: str
    backup_id: str
    ended: datetime
    server: str = ""
    """The server name it is stored under (the PostgreSQL system it is a backup of)."""


def completed(backups: Iterable[Obj], cluster: str = "") -> list[Done]:
    """The completed backups with a barman id and an end time, oldest first. A backup without ``status.serverName``
    (taken before it was recorded) is of the cluster's first system, stored under ``cluster``."""
    found: list[Done] = []
    for backup in backups:
        status = backup.get("status") or {}
        ended = parse_time(status.get("completedAt"))
        if status.get("phase") == "Completed" and status.get("backupId") and ended is not None:
            server = str(status.get("serverName") or cluster)
            found.append(Done(backup["metadata"]["name"], str(status["backupId"]), ended, server))
    return sorted(found, key=lambda d: (d.ended, d.name))


def expired(backups: Sequence[Done], retention_days: int, now: datetime) -> list[Done]:
    """What the recovery window no longer needs (see the module's docstring), oldest first."""
    ordered = sorted(backups, key=lambda d: (d.ended, d.name))
    if len(ordered) <= 1:
        return []
    cutoff = now - timedelta(days=retention_days)
    before = [d for d in ordered if d.ended < cutoff]
    keep_from = len(before) - 1 if before else 0  # the newest before the window is the window's base
    keep_from = min(keep_from, len(ordered) - 1)  # the newest of all is always kept
    return ordered[:keep_from]


@dataclass(frozen=True)
class Summary:
    """What the cluster's status and condition ``LastBackupSucceeded`` say about its backups."""

    last_successful: datetime | None
    last_failed: datetime | None
    first_recoverability_point: datetime | None
    condition: tuple[bool, str, str] | None
    """(status, reason, message) of ``LastBackupSucceeded``; None before any backup finished."""


def summary(backups: Iterable[Obj]) -> Summary:
    """The cluster's backup summary from its PostgresBackups."""
    items = list(backups)
    done = completed(items)
    finished: list[tuple[datetime, str, Obj]] = []
    failed_times: list[datetime] = []
    for backup in items:
        status = backup.get("status") or {}
        when = parse_time(status.get("completedAt"))
        if status.get("phase") in TERMINAL and when is not None:
            finished.append((when, backup["metadata"]["name"], backup))
            if status.get("phase") == "Failed":
                failed_times.append(when)
    condition: tuple[bool, str, str] | None = None
    if finished:
        when, name, last = max(finished, key=lambda f: (f[0], f[1]))
        status = last.get("status") or {}
        if status.get("phase") == "Completed":
            condition = (True, "Completed", f"backup {name} ({status.get('backupId')}) completed at "
                         f"{when.isoformat()}")  # fmt: skip
        else:
            why = status.get("message") or "no reason given"
            condition = (False, str(status.get("reason") or "BackupFailed"), f"backup {name} failed at "
                         f"{when.isoformat()}: {why}"[:4000])  # fmt: skip
    return Summary(
        last_successful=done[-1].ended if done else None,
        last_failed=max(failed_times) if failed_times else None,
        first_recoverability_point=done[0].ended if done else None,
        condition=condition,
    )
