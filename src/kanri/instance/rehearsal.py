"""A restore rehearsal: ``kanri-instance restore-test``, the one process of a throwaway pod.

"The pod is Running" is not "the data is recoverable". This restores the cluster's newest base backup plus all its
archived WAL (from the cluster's own repository, read-only: the restored server never archives), lets PostgreSQL
promote itself at the end, and checks what came back:

- ``recovery``: replay reached a consistent recovery point and ended (a missing or damaged WAL file stops it short);
- ``rows``: every user table of every database is read in full (``count(*)``: a damaged heap page fails it), and
  the catalogs are not empty;
- ``amcheck``: ``bt_index_check`` on every valid btree index (the extension is created in the throwaway copy);
- ``checksums``: ``pg_checksums --check`` on the cleanly stopped copy when the data has checksums (said otherwise).

The verdict (:class:`Verdict`) is one JSON object: the last line of stdout, and the pod's termination message
(``/dev/termination-log``, at most 4096 bytes), which the operator reads from the pod's status
(:mod:`kanri.postgres.recovery.rehearsal`). The exit code is 0 when every check passed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import psycopg
import structlog
from psycopg import sql

from kanri.instance.config import ClusterConfig, Settings, SettingsError
from kanri.instance.db import connect, fetch_one
from kanri.instance.logs import configure_logging
from kanri.instance.recovery_plan import RecoveryPlan
from kanri.instance.restore import BackupInfo, Recovery, RecoveryOutcome, RestoreError, prepare, staging_settings

__all__ = ["Check", "Verdict", "main", "rehearse"]

log = structlog.get_logger("kanri.instance.rehearsal")

TERMINATION_LOG = Path("/dev/termination-log")
MESSAGE_LIMIT = 4096
"""The kubelet keeps at most this much of a termination message."""

MAX_FAILURES = 5
"""How many failing indexes or tables one check names."""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str


@dataclass
class Verdict:
    """What the rehearsal found; ``result`` is ``Succeeded`` only when every check passed."""

    started: datetime
    checks: list[Check] = field(default_factory=list)
    backup: str | None = None
    recovered_to: datetime | None = None
    lsn: str | None = None
    timeline: int | None = None
    duration: float = 0.0

    @property
    def result(self) -> Literal["Succeeded", "Failed"]:
        return "Succeeded" if self.checks and all(c.ok for c in self.checks) else "Failed"

    @property
    def message(self) -> str:
        failed = [f"{c.name}: {c.message}" for c in self.checks if not c.ok]
        if failed:
            return "; ".join(failed)
        return "; ".join(f"{c.name}: {c.message}" for c in self.checks) or "no check ran"

    def as_json(self) -> dict[str, Any]:
        """The termination message (short field names; the whole fits in the kubelet's 4096 bytes)."""
        document = {
            "result": self.result,
            "time": self.started.isoformat(),
            "durationSeconds": round(self.duration, 1),
            "backup": self.backup,
            "recoveredTo": self.recovered_to.isoformat() if self.recovered_to else None,
            "lsn": self.lsn,
            "timeline": self.timeline,
            "message": self.message[:1500],
            "checks": [{"name": c.name, "ok": c.ok, "message": c.message[:300]} for c in self.checks],
        }
        return document


async def _databases(settings: Settings) -> list[str]:
    async with await connect(settings) as conn:
        cursor = await conn.execute("SELECT datname FROM pg_database WHERE datallowconn ORDER BY datname")
        return [row["datname"] for row in await cursor.fetchall()]


async def check_rows(settings: Settings, databases: list[str]) -> Check:
    """Read every user table in full; the catalogs must list relations."""
    tables = rows = 0
    failures: list[str] = []
    for database in databases:
        async with await connect(settings, dbname=database, statement_timeout_ms=0) as conn:
            catalog = (await fetch_one(conn, "SELECT count(*) AS n FROM pg_class"))["n"]
            if catalog == 0:
                failures.append(f"{database}: pg_class is empty")
                continue
            cursor = await conn.execute(
                "SELECT c.oid::regclass::text AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind IN ('r', 'm') AND c.relpersistence = 'p'"
                " AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'"
                " ORDER BY 1"
            )
            for row in await cursor.fetchall():
                try:
                    counted = await fetch_one(conn, sql.SQL("SELECT count(*) AS n FROM {}").format(
                        sql.SQL(row["name"])))  # fmt: skip  # regclass::text is quoted already
                except psycopg.Error as exc:
                    failures.append(f"{database}.{row['name']}: {str(exc).strip().splitlines()[0]}")
                    continue
                tables += 1
                rows += int(counted["n"])
    if failures:
        return Check("rows", False, f"{len(failures)} table(s) unreadable: " + "; ".join(failures[:MAX_FAILURES]))
    return Check("rows", True, f"{rows} rows in {tables} user tables of {len(databases)} databases read in full")


async def check_indexes(settings: Settings, databases: list[str]) -> Check:
    """``bt_index_check`` on every valid btree index of every database."""
    checked = 0
    failures: list[str] = []
    for database in databases:
        async with await connect(settings, dbname=database, statement_timeout_ms=0) as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
            cursor = await conn.execute(
                "SELECT c.oid, c.oid::regclass::text AS name FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " JOIN pg_am am ON am.oid = c.relam WHERE am.amname = 'btree' AND i.indisvalid AND i.indisready"
                " AND c.relpersistence = 'p' ORDER BY c.oid"
            )
            for row in await cursor.fetchall():
                try:
                    await conn.execute("SELECT bt_index_check(%s::oid::regclass)", (row["oid"],))
                except psycopg.Error as exc:
                    failures.append(f"{database}.{row['name']}: {str(exc).strip().splitlines()[0]}")
                    continue
                checked += 1
    if failures:
        return Check("amcheck", False, f"{len(failures)} index(es) corrupt: " + "; ".join(failures[:MAX_FAILURES]))
    return Check("amcheck", True, f"{checked} btree indexes in {len(databases)} databases are consistent")


async def check_checksums(settings: Settings, enabled: bool) -> Check:
    """``pg_checksums --check`` on the stopped copy."""
    if not enabled:
        return Check("checksums", True, "not checked: the data has no checksums (initdb without --data-checksums)")
    proc = await asyncio.create_subprocess_exec(
        settings.binary("pg_checksums"),
        "--check",
        "--pgdata",
        str(settings.pgdata),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "LC_ALL": "C"},
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace").strip()
    sys.stderr.write(text + "\n")
    if proc.returncode != 0:
        errors = [line for line in text.splitlines() if "error" in line.lower() or "failed" in line.lower()]
        return Check("checksums", False, "; ".join(errors[-3:]) or f"pg_checksums failed with code {proc.returncode}")
    scanned = next((line.split(":", 1)[1].strip() for line in text.splitlines() if "Blocks scanned" in line), "?")
    return Check("checksums", True, f"pg_checksums: {scanned} blocks verified")


def _recovery_check(outcome: RecoveryOutcome, backup: BackupInfo) -> Check:
    where = f"consistent at {outcome.consistent_at}" if outcome.consistent_at else "consistent"
    until = outcome.recovered_to.isoformat() if outcome.recovered_to else "the backup's end (no later commit)"
    return Check("recovery", True, f"backup {backup.backup_id} restored and {where}; replayed up to {until}; "
                 f"promoted on timeline {outcome.timeline} at {outcome.lsn}")  # fmt: skip


async def rehearse(settings: Settings, config: ClusterConfig, *, immediate: bool = False) -> Verdict:
    """Restore the newest backup of ``config.archive`` into PGDATA (which must not exist yet) and check it."""
    verdict = Verdict(started=datetime.now(UTC))
    began = time.monotonic()
    try:
        await _rehearse(settings, config, verdict, immediate=immediate)
    except RestoreError as exc:
        verdict.checks.append(Check("recovery", False, str(exc)))
    except (psycopg.Error, OSError) as exc:
        verdict.checks.append(Check("checks", False, f"the checks could not run: {str(exc).strip()[:300]}"))
    verdict.duration = time.monotonic() - began
    return verdict


async def _rehearse(settings: Settings, config: ClusterConfig, verdict: Verdict, *, immediate: bool) -> None:
    if config.archive is None:
        raise RestoreError("the cluster has no backup repository: there is nothing to restore")
    plan = RecoveryPlan(source=config.archive, targetImmediate=immediate)
    settings.pgdata.parent.mkdir(parents=True, exist_ok=True)
    backup = await prepare(settings, config, plan, "archive", settings.pgdata, archive=False,
                           on_progress=lambda message: log.info("restore test", progress=message))  # fmt: skip
    verdict.backup = backup.backup_id
    recovery = Recovery(staging_settings(settings, settings.pgdata))
    await recovery.start()
    try:
        outcome = await recovery.wait_promoted()
        verdict.recovered_to, verdict.lsn, verdict.timeline = outcome.recovered_to, outcome.lsn, outcome.timeline
        verdict.checks.append(_recovery_check(outcome, backup))
        async with await connect(settings) as conn:
            checksums = (await fetch_one(conn, "SHOW data_checksums"))["data_checksums"] == "on"
        databases = await _databases(settings)
        verdict.checks.append(await check_rows(settings, databases))
        verdict.checks.append(await check_indexes(settings, databases))
    finally:
        await recovery.stop()
    verdict.checks.append(await check_checksums(settings, checksums))


def report(verdict: Verdict, termination_log: Path) -> str:
    """The verdict as one JSON line: printed last on stdout and written as the termination message."""
    line = json.dumps(verdict.as_json(), separators=(",", ":"))
    if len(line.encode()) > MESSAGE_LIMIT:  # many long check messages: keep the verdict, drop the details
        document = verdict.as_json()
        document["checks"] = [{"name": c.name, "ok": c.ok} for c in verdict.checks]
        line = json.dumps(document, separators=(",", ":"))[:MESSAGE_LIMIT]
    try:
        termination_log.write_text(line)
    except OSError as exc:
        log.warning("cannot write the termination message", path=str(termination_log), error=exc.strerror)
    print(line, flush=True)
    return line


def main(env: dict[str, str] | None = None) -> int:
    """``kanri-instance restore-test``: configured like an instance (``Settings.from_env``); 0 when it passed."""
    environ = dict(os.environ if env is None else env)
    try:
        settings = Settings.from_env(environ)
    except SettingsError as exc:
        configure_logging()
        log.error("invalid settings", reason=str(exc))
        return 2
    configure_logging(instance=settings.name, cluster=settings.cluster, namespace=settings.namespace)
    try:
        config = ClusterConfig.parse(settings.config_file.read_bytes())
    except (OSError, ValueError) as exc:
        config = None
        problem = str(exc)
    immediate = environ.get("KANRI_RESTORE_TEST_TARGET", "").strip() == "immediate"
    if config is None:
        verdict = Verdict(started=datetime.now(UTC), checks=[Check("config", False, problem)])
    else:
        verdict = asyncio.run(rehearse(settings, config, immediate=immediate))
    log.info("restore test finished", result=verdict.result, message=verdict.message[:500])
    report(verdict, Path(environ.get("KANRI_TERMINATION_LOG") or TERMINATION_LOG))
    return 0 if verdict.result == "Succeeded" else 1
