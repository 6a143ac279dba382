"""The instance exporter: PostgreSQL's own numbers as Prometheus metrics on port 9187 (container port ``metrics``).

A scrape never touches PostgreSQL: a refresh task reads everything every :data:`REFRESH_INTERVAL` seconds over its
own connection, with a short statement timeout, into one immutable :class:`Snapshot`; ``/metrics`` renders the last
snapshot. So a slow or stuck PostgreSQL can neither block the manager's loops nor hold a scrape; it shows as
``kanri_instance_up 0`` and an old ``kanri_instance_last_refresh_timestamp_seconds``.

Every series carries ``namespace``, ``cluster`` and ``instance`` (the instance's name, ``POD_NAME``), the labels the
operator's metrics use: scrape with ``honor_labels: true`` (docs/observability.md). No query selects a secret (no
conninfo, no query text).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import psycopg
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from psycopg.rows import DictRow

from kanri.instance.config import Settings
from kanri.instance.db import APPLICATION_NAME, connect, fetch_one

log = structlog.get_logger("kanri.instance.exporter")

METRICS_PORT = 9187
"""The default port (``KANRI_METRICS_PORT``; 0 turns the exporter off)."""

REFRESH_INTERVAL = 5.0
"""Seconds between two reads of PostgreSQL's statistics."""

STATEMENT_TIMEOUT_MS = 2_000
"""A refresh statement that takes longer is cancelled: the snapshot then says ``up 0``."""

BASE_LABELS = ("namespace", "cluster", "instance")

METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # name (without _total for counters): (type, help, labels beyond BASE_LABELS)
    "kanri_instance_up": ("gauge", "1 when the last refresh reached PostgreSQL and read its statistics", ()),
    "kanri_instance_last_refresh_timestamp_seconds": ("gauge", "when the statistics were last read", ()),
    "kanri_instance_postgres_running": ("gauge", "1 while the manager's PostgreSQL process runs", ()),
    "kanri_instance_role": ("gauge", "1 for the instance's current role (primary or replica)", ("role",)),
    "kanri_instance_timeline": ("gauge", "the timeline the instance is on", ()),
    "kanri_instance_fenced": ("gauge", "1 while the instance is fenced (PostgreSQL kept stopped)", ()),
    "kanri_instance_replication_paused": ("gauge", "1 while replication is paused on purpose", ()),
    "kanri_instance_isolation_last_contact_timestamp_seconds": (
        "gauge",
        "a primary's last contact with the API server or a standby (isolation check enabled only)",
        (),
    ),
    "kanri_instance_standby_streaming": (
        "gauge",
        "on a primary: 1 per standby whose WAL sender streams",
        ("standby", "sync_state"),
    ),
    "kanri_instance_replication_lag_bytes": (
        "gauge",
        "on a primary: WAL written but not yet replayed by each standby",
        ("standby",),
    ),
    "kanri_instance_replication_lag_seconds": (
        "gauge",
        "on a primary: each standby's replay lag (0 when it has caught up)",
        ("standby",),
    ),
    "kanri_instance_wal_receiver_streaming": ("gauge", "on a replica: 1 while its WAL receiver streams", ()),
    "kanri_instance_replay_lag_bytes": ("gauge", "on a replica: WAL received but not yet replayed", ()),
    "kanri_instance_archived": ("counter", "WAL files archived (pg_stat_archiver)", ()),
    "kanri_instance_archive_failed": ("counter", "failed attempts to archive a WAL file (pg_stat_archiver)", ()),
    "kanri_instance_last_archived_timestamp_seconds": ("gauge", "when a WAL file was last archived", ()),
    "kanri_instance_last_archive_failure_timestamp_seconds": ("gauge", "when archiving last failed", ()),
    "kanri_instance_wal_bytes": ("gauge", "size of pg_wal", ()),
    "kanri_instance_archive_pending": (
        "gauge",
        "WAL segments and history files waiting to be archived (.ready in pg_wal/archive_status): a backlog",
        (),
    ),
    "kanri_instance_volume_size_bytes": ("gauge", "size of the data volume (statvfs of PGDATA)", ()),
    "kanri_instance_volume_free_bytes": ("gauge", "space left on the data volume for PostgreSQL", ()),
    # kanri:disk-full
    "kanri_instance_disk_full": (
        "gauge",
        "1 while the instance reports DiskFull (PostgreSQL failed for lack of space)",
        (),
    ),
    "kanri_instance_database_size_bytes": ("gauge", "size of each database", ("database",)),
    "kanri_instance_connections": ("gauge", "client connections by state (the manager's own excepted)", ("state",)),
    "kanri_instance_xact_commit": ("counter", "transactions committed", ("database",)),
    "kanri_instance_xact_rollback": ("counter", "transactions rolled back", ("database",)),
    "kanri_instance_checkpoints_timed": ("counter", "scheduled checkpoints", ()),
    "kanri_instance_checkpoints_requested": ("counter", "requested checkpoints (WAL volume, CHECKPOINT, shutdown)", ()),
}
"""Everything the exporter can expose; docs/observability.md lists the same (tests/unit/test_monitoring.py reads
this table, so the alerts and dashboard can only query what exists)."""

Sample = tuple[tuple[str, ...], float]
"""Extra label values (in the order of :data:`METRICS`) and a value."""


@dataclass(frozen=True)
class Snapshot:
    """One refresh's values: metric name → samples. A metric with no sample is left out of the scrape."""

    values: Mapping[str, list[Sample]] = field(default_factory=dict)


@dataclass(frozen=True)
class ManagerState:
    """What the manager knows without PostgreSQL (read at every refresh, from memory and the volume's markers)."""

    running: bool
    fenced: bool
    paused: bool
    last_contact: float | None = None
    disk_full: bool = False  # kanri:disk-full


# ---- queries (each one short, none selecting a secret) ------------------------------------------------------------

_COMMON = """
SELECT pg_is_in_recovery() AS in_recovery, current_setting('server_version_num')::int AS version,
       CASE WHEN pg_is_in_recovery()
            THEN coalesce((SELECT received_tli FROM pg_stat_wal_receiver),
                          (SELECT timeline_id FROM pg_control_checkpoint()))
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END AS timeline,
       (SELECT coalesce(sum(size), 0) FROM pg_ls_waldir())::float8 AS wal_bytes,
       (SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready')::float8 AS archive_pending
"""

_STANDBYS = """
SELECT application_name AS standby, state, sync_state,
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn), 0)::float8 AS lag_bytes,
       coalesce(extract(epoch FROM replay_lag), 0)::float8 AS lag_seconds
  FROM pg_stat_replication ORDER BY application_name
"""

_RECEIVER = """
SELECT coalesce((SELECT status = 'streaming' FROM pg_stat_wal_receiver), false) AS streaming,
       greatest(coalesce(pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()), 0), 0)::float8 AS lag
"""

_ARCHIVER = """
SELECT archived_count, failed_count,
       extract(epoch FROM last_archived_time)::float8 AS last_archived,
       extract(epoch FROM last_failed_time)::float8 AS last_failed
  FROM pg_stat_archiver
"""

_DATABASES = """
SELECT d.datname AS database, pg_database_size(d.oid)::float8 AS size,
       coalesce(s.xact_commit, 0)::float8 AS commits, coalesce(s.xact_rollback, 0)::float8 AS rollbacks
  FROM pg_database d LEFT JOIN pg_stat_database s ON s.datid = d.oid
 WHERE d.datallowconn AND NOT d.datistemplate ORDER BY d.datname
"""

_STATES = ("active", "idle", "idle in transaction")
"""pg_stat_activity states always exported (others, e.g. ``idle in transaction (aborted)``, when present)."""
_CONNECTIONS = """
SELECT coalesce(state, 'unknown') AS state, count(*)::float8 AS n FROM pg_stat_activity
 WHERE backend_type = 'client backend' AND application_name IS DISTINCT FROM %s GROUP BY 1 ORDER BY 1
"""

# PostgreSQL 17 moved the checkpoint counters from pg_stat_bgwriter to pg_stat_checkpointer.
_CHECKPOINTS_16 = (
    "SELECT checkpoints_timed::float8 AS timed, checkpoints_req::float8 AS requested FROM pg_stat_bgwriter"
)
_CHECKPOINTS_17 = "SELECT num_timed::float8 AS timed, num_requested::float8 AS requested FROM pg_stat_checkpointer"


async def read_postgres(conn: psycopg.AsyncConnection[DictRow], application_name: str) -> dict[str, list[Sample]]:
    """PostgreSQL's part of a snapshot (raises when a statement fails or times out)."""
    common = await fetch_one(conn, _COMMON)
    replica = bool(common["in_recovery"])
    values: dict[str, list[Sample]] = {
        "kanri_instance_role": [(("replica" if replica else "primary",), 1.0)],
        "kanri_instance_timeline": [((), float(common["timeline"] or 0))],
        "kanri_instance_wal_bytes": [((), float(common["wal_bytes"]))],
        "kanri_instance_archive_pending": [((), float(common["archive_pending"]))],
    }
    if replica:
        row = await fetch_one(conn, _RECEIVER)
        values["kanri_instance_wal_receiver_streaming"] = [((), 1.0 if row["streaming"] else 0.0)]
        values["kanri_instance_replay_lag_bytes"] = [((), float(row["lag"]))]
    else:
        rows = await (await conn.execute(_STANDBYS)).fetchall()
        values["kanri_instance_standby_streaming"] = [
            ((r["standby"], r["sync_state"] or "unknown"), 1.0 if r["state"] == "streaming" else 0.0) for r in rows
        ]
        values["kanri_instance_replication_lag_bytes"] = [((r["standby"],), float(r["lag_bytes"])) for r in rows]
        values["kanri_instance_replication_lag_seconds"] = [((r["standby"],), float(r["lag_seconds"])) for r in rows]
    archiver = await fetch_one(conn, _ARCHIVER)
    values["kanri_instance_archived"] = [((), float(archiver["archived_count"]))]
    values["kanri_instance_archive_failed"] = [((), float(archiver["failed_count"]))]
    if archiver["last_archived"] is not None:
        values["kanri_instance_last_archived_timestamp_seconds"] = [((), archiver["last_archived"])]
    if archiver["last_failed"] is not None:
        values["kanri_instance_last_archive_failure_timestamp_seconds"] = [((), archiver["last_failed"])]
    databases = await (await conn.execute(_DATABASES)).fetchall()
    values["kanri_instance_database_size_bytes"] = [((r["database"],), r["size"]) for r in databases]
    values["kanri_instance_xact_commit"] = [((r["database"],), r["commits"]) for r in databases]
    values["kanri_instance_xact_rollback"] = [((r["database"],), r["rollbacks"]) for r in databases]
    connections = await (await conn.execute(_CONNECTIONS, (application_name,))).fetchall()
    counts = {str(r["state"]): float(r["n"]) for r in connections}
    # the usual states at 0 too: a quiet instance shows "0 active", not "no data"
    values["kanri_instance_connections"] = [((state,), counts.get(state, 0.0)) for state in sorted({*_STATES, *counts})]
    checkpoints = await fetch_one(conn, _CHECKPOINTS_17 if common["version"] >= 170000 else _CHECKPOINTS_16)
    values["kanri_instance_checkpoints_timed"] = [((), checkpoints["timed"])]
    values["kanri_instance_checkpoints_requested"] = [((), checkpoints["requested"])]
    return values


def read_volume(path: os.PathLike[str] | str) -> dict[str, list[Sample]]:
    """The data volume's size and the space left for an unprivileged writer (PostgreSQL is not root)."""
    try:
        stat = os.statvfs(path)
    except OSError:  # not created yet (a replica still cloning into an empty volume)
        return {}
    return {
        "kanri_instance_volume_size_bytes": [((), float(stat.f_blocks * stat.f_frsize))],
        "kanri_instance_volume_free_bytes": [((), float(stat.f_bavail * stat.f_frsize))],
    }


def manager_samples(state: ManagerState) -> dict[str, list[Sample]]:
    """The manager's part of a snapshot."""
    values: dict[str, list[Sample]] = {
        "kanri_instance_postgres_running": [((), 1.0 if state.running else 0.0)],
        "kanri_instance_fenced": [((), 1.0 if state.fenced else 0.0)],
        "kanri_instance_replication_paused": [((), 1.0 if state.paused else 0.0)],
        "kanri_instance_disk_full": [((), 1.0 if state.disk_full else 0.0)],  # kanri:disk-full
    }
    if state.last_contact is not None:
        values["kanri_instance_isolation_last_contact_timestamp_seconds"] = [((), state.last_contact)]
    return values


class SnapshotCollector(Collector):
    """Renders the last :class:`Snapshot` with the instance's base labels."""

    def __init__(self, base: tuple[str, str, str]) -> None:
        self.base = base
        self.snapshot = Snapshot()

    def collect(self) -> Iterable[Metric]:
        values = self.snapshot.values
        for name, (kind, help_text, extra) in METRICS.items():
            samples = values.get(name)
            if not samples:
                continue
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_type(name, help_text, labels=[*BASE_LABELS, *extra])
            for labels, value in samples:
                family.add_metric([*self.base, *labels], value)
            yield family


def metrics_port(env: Mapping[str, str] | None = None) -> int:
    """``KANRI_METRICS_PORT`` (default 9187; 0: no exporter)."""
    raw = (os.environ if env is None else env).get("KANRI_METRICS_PORT", "").strip() or str(METRICS_PORT)
    if not raw.isdigit() or not 0 <= int(raw) < 65536:
        raise ValueError(f"KANRI_METRICS_PORT must be a TCP port or 0, not {raw!r}")
    return int(raw)


class InstanceExporter:
    """``start()`` serves ``/metrics`` and begins refreshing; ``stop()`` ends both. ``state`` is called at every
    refresh for what the manager knows (never blocks: memory and a marker file)."""

    def __init__(
        self,
        settings: Settings,
        state: Callable[[], ManagerState],
        *,
        port: int = METRICS_PORT,
        interval: float = REFRESH_INTERVAL,
        application_name: str = APPLICATION_NAME,
    ) -> None:
        self.settings = settings
        self.state = state
        self.port = port
        self.interval = interval
        self.application_name = application_name
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = SnapshotCollector((settings.namespace, settings.cluster, settings.name))
        self.registry.register(self.collector)
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[DictRow] | None = None
        self._last_error: str | None = None

    async def start(self) -> None:
        """Serve ``/metrics`` and start refreshing (neither when the port is taken: logged, not raised)."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.settings.http_listen, self.port).start()
        except OSError as exc:  # metrics are not worth failing PID 1 for: the instance runs on without them
            log.warning("no instance exporter: its port cannot be bound", port=self.port, error=str(exc))
            await self._runner.cleanup()
            self._runner = None
            return
        self._task = asyncio.create_task(self._loop(), name="exporter")

    async def stop(self) -> None:
        """Stop refreshing and serving."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain", charset="utf-8")

    async def _loop(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval)

    async def refresh(self) -> Snapshot:
        """Read everything once and publish the new snapshot (``up`` 0 when PostgreSQL could not be read)."""
        state = self.state()
        values = manager_samples(state) | read_volume(self.settings.pgdata)
        up = 0.0
        if state.running:
            try:
                values |= await self._read()
                up = 1.0
                self._last_error = None
            except (psycopg.Error, OSError, RuntimeError) as exc:
                await self._close()
                message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                if message != self._last_error:  # once per distinct error, not every few seconds
                    log.warning("exporter could not read PostgreSQL's statistics", error=message)
                    self._last_error = message
        values["kanri_instance_up"] = [((), up)]
        values["kanri_instance_last_refresh_timestamp_seconds"] = [((), time.time())]
        snapshot = Snapshot(values)
        self.collector.snapshot = snapshot
        return snapshot

    async def _read(self) -> dict[str, list[Sample]]:
        if self._conn is None or self._conn.closed:
            self._conn = await connect(self.settings, timeout=2, statement_timeout_ms=STATEMENT_TIMEOUT_MS)
        async with asyncio.timeout(STATEMENT_TIMEOUT_MS / 1000 * 4):  # a hung socket, not a slow statement
            return await read_postgres(self._conn, self.application_name)

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


def described() -> Iterator[tuple[str, str, tuple[str, ...]]]:
    """(sample name, type, label names) of every metric, as a scrape shows them (counters with ``_total``)."""
    for name, (kind, _, extra) in METRICS.items():
        yield (f"{name}_total" if kind == "counter" else name), kind, (*BASE_LABELS, *extra)


__all__ = ["METRICS", "InstanceExporter", "ManagerState", "Snapshot", "described", "metrics_port"]
