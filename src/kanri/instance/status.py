"""What the operator reads about an instance: role, timeline, LSNs, replication, readiness.

Pure queries over one connection; no secrets are selected (pg_stat_replication's conninfo-free columns only).
LSNs are strings (``0/3000148``), the system identifier too (it exceeds JavaScript's integer range).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import DictRow

from kanri.contract.status import Archiver, Replica
from kanri.instance.db import APPLICATION_NAME, fetch_one

_COMMON = """
SELECT pg_is_in_recovery() AS in_recovery,
       (SELECT system_identifier::text FROM pg_control_system()) AS system_identifier,
       current_setting('server_version') AS version,
       (SELECT count(*) FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND application_name IS DISTINCT FROM %s) AS connections,
       EXISTS (SELECT 1 FROM pg_settings WHERE pending_restart) AS pending_restart
"""

STANDBY_LIMITS = (
    "max_connections",
    "max_locks_per_transaction",
    "max_prepared_transactions",
    "max_wal_senders",
    "max_worker_processes",
)
"""Settings a hot standby must have at least as high as its primary (PostgreSQL aborts recovery otherwise)."""

# A pending value lower than the running one: the primary must restart first (it then logs the new value in WAL),
# because a replica restarted first with a lower value than its primary's refuses to start ("recovery aborted because
# of insufficient parameter settings"). The last entry of a name in the files is the one that counts.
_LOWERED = """
SELECT coalesce(array_agg(s.name ORDER BY s.name), '{}') AS lowered
  FROM pg_settings s
  JOIN (SELECT DISTINCT ON (name) name, setting FROM pg_file_settings ORDER BY name, seqno DESC) f USING (name)
 WHERE s.pending_restart AND s.name = ANY(%s) AND f.setting ~ '^[0-9]+$' AND f.setting::bigint < s.setting::bigint
"""

# pg_walfile_name() uses the timeline WAL is being inserted on: the new one right after a promotion, before the
# end-of-recovery checkpoint has updated pg_control.
_PRIMARY = """
SELECT pg_current_wal_lsn()::text AS write_lsn,
       pg_current_wal_flush_lsn()::text AS flush_lsn,
       ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int AS timeline
"""

_REPLICAS = """
SELECT application_name AS name, state, sent_lsn::text AS sent_lsn, flush_lsn::text AS flush_lsn,
       replay_lsn::text AS replay_lsn,
       pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint AS lag_bytes, sync_state
  FROM pg_stat_replication ORDER BY application_name
"""

_REPLICA = """
SELECT pg_last_wal_receive_lsn()::text AS receive_lsn,
       pg_last_wal_replay_lsn()::text AS replay_lsn,
       greatest(pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()), 0)::bigint AS lag_bytes,
       coalesce((SELECT status = 'streaming' FROM pg_stat_wal_receiver), false) AS streaming,
       coalesce((SELECT received_tli FROM pg_stat_wal_receiver),
                (SELECT timeline_id FROM pg_control_checkpoint())) AS timeline
"""


# pg_stat_archiver counts since the last stats reset; the operator reads the names and times (a failure newer than
# the last success means the archiver is stuck on that segment)
_ARCHIVER = """
SELECT archived_count, last_archived_wal, last_archived_time, failed_count, last_failed_wal, last_failed_time,
       current_setting('archive_mode') AS archive_mode
  FROM pg_stat_archiver
"""


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


async def archiver(conn: psycopg.AsyncConnection[DictRow]) -> Archiver:
    """The ``archiver`` part of ``GET /status`` (times ISO 8601)."""
    row = await fetch_one(conn, _ARCHIVER)
    return Archiver(
        mode=row["archive_mode"],
        archived_count=row["archived_count"],
        last_archived_wal=row["last_archived_wal"],
        last_archived_time=_iso(row["last_archived_time"]),
        failed_count=row["failed_count"],
        last_failed_wal=row["last_failed_wal"],
        last_failed_time=_iso(row["last_failed_time"]),
    )


async def collect(conn: psycopg.AsyncConnection[DictRow]) -> dict[str, Any]:
    """The database part of ``GET /status``: :class:`~kanri.contract.status.InstanceStatus` fields by name (a
    replica's positions or a primary's, never both)."""
    common = await fetch_one(conn, _COMMON, (APPLICATION_NAME,))
    status: dict[str, Any] = {
        "role": "replica" if common["in_recovery"] else "primary",
        "in_recovery": common["in_recovery"],
        "system_identifier": common["system_identifier"],
        "postgres_version": common["version"],
        "connections": common["connections"],
        "pending_restart": common["pending_restart"],
        "pending_lowers": await lowered_standby_limits(conn) if common["pending_restart"] else [],
        "config_errors": await config_errors(conn),
        "archiver": await archiver(conn),
    }
    if common["in_recovery"]:
        row = await fetch_one(conn, _REPLICA)
        status.update(
            timeline=row["timeline"],
            receive_lsn=row["receive_lsn"],
            replay_lsn=row["replay_lsn"],
            lag_bytes=row["lag_bytes"],
            streaming=row["streaming"],
        )
    else:
        row = await fetch_one(conn, _PRIMARY)
        cursor = await conn.execute(_REPLICAS)
        replicas = [Replica(**r) for r in await cursor.fetchall()]
        status.update(timeline=row["timeline"], write_lsn=row["write_lsn"], flush_lsn=row["flush_lsn"],
                      replicas=replicas)  # fmt: skip
    return status


async def lowered_standby_limits(conn: psycopg.AsyncConnection[DictRow]) -> list[str]:
    """The :data:`STANDBY_LIMITS` waiting for a restart with a lower value than the one running."""
    return list((await fetch_one(conn, _LOWERED, (list(STANDBY_LIMITS),)))["lowered"])


async def config_errors(conn: psycopg.AsyncConnection[DictRow]) -> list[str]:
    """Entries of the configuration files PostgreSQL cannot use (one bad entry blocks a whole reload).
    Invalid values of known parameters are not caught here; PostgreSQL only logs them."""
    # "setting could not be applied" marks a parameter waiting for a restart: that is pendingRestart, not an error;
    # rows about a whole file (not parsable) have no name
    cursor = await conn.execute(
        "SELECT coalesce(name, sourcefile, 'configuration') || ': ' || error AS problem FROM pg_file_settings"
        " WHERE error IS NOT NULL AND error <> 'setting could not be applied' ORDER BY seqno"
    )
    return [row["problem"] for row in await cursor.fetchall()]


async def readiness(conn: psycopg.AsyncConnection[DictRow]) -> str | None:
    """None when the instance can serve: a primary that takes connections, a replica whose WAL receiver streams.
    Otherwise the reason it cannot."""
    row = await fetch_one(
        conn,
        "SELECT pg_is_in_recovery() AS in_recovery,"
        " coalesce((SELECT status FROM pg_stat_wal_receiver), 'not running') AS receiver",
    )
    if row["in_recovery"] and row["receiver"] != "streaming":
        return f"replica WAL receiver is {row['receiver']}"
    return None
