"""Restore a data directory from Barman Cloud backups: a new cluster's primary (``bootstrap.recovery``) or the
throwaway instance of a restore rehearsal (:mod:`kanri.instance.rehearsal`).

The steps, all in the bootstrap's staging directory (``<PGDATA>.kanri-new``, renamed into place only when done, so a
pod killed halfway leaves nothing that looks like a data directory):

1. pick the backup (:func:`choose_backup`: the one named, else the newest that finished before the target) from
   ``barman-cloud-backup-list`` and fetch it with ``barman-cloud-restore``;
2. write the files (:func:`recovery_conf`): the manager's own postgresql.conf — which replaces the restored one and
   with it the source's ``archive_command`` barman leaves there — plus ``restore_command`` (``kanri-instance
   restore-wal``, reading the SOURCE's server name), the ``recovery_target_*`` keys with ``recovery_target_action =
   promote``, ``recovery.signal``, and nothing listening but the private unix socket;
3. run PostgreSQL until it has promoted itself at the target (a new timeline), its log kept to explain a failure
   (:class:`Recovery`). A new cluster's primary then archives into its OWN server name; a rehearsal never archives.

The key pair of the source's repository is read from files (``KANRI_RECOVERY_CREDENTIALS_DIR`` for a recovery, the
cluster's own ``KANRI_BACKUP_CREDENTIALS_DIR`` for a rehearsal) and handed to barman in its environment only.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import psycopg
import structlog

from kanri.instance.archive import DEFAULT_CREDENTIALS_DIR, ArchiveTarget, barman_program, cloud_options
from kanri.instance.archive import credentials_env as read_credentials
from kanri.instance.conf import quote, render_hba, render_postgresql_conf, write_if_changed
from kanri.instance.config import ClusterConfig, Settings
from kanri.instance.db import connect, fetch_one
from kanri.instance.identity import binary_version
from kanri.instance.recovery_plan import RecoveryPlan

__all__ = [
    "RECOVERY_CREDENTIALS_DIR",
    "BackupInfo",
    "Recovery",
    "RecoveryOutcome",
    "RestoreError",
    "Source",
    "choose_backup",
    "credentials_dir",
    "parse_backup_list",
    "recovery_conf",
    "recovery_parameters",
    "restore_primary",
    "restore_wal",
    "systems",
    "wal_restore_argv",
]

log = structlog.get_logger("kanri.instance.restore")

RECOVERY_CREDENTIALS_DIR = Path("/etc/kanri/recovery")
"""Where the operator mounts ``<cluster>-recovery-credentials`` (the source repository's key pair)."""

Source = Literal["recovery", "archive"]
"""Which repository entry of ``instance.json`` to read: ``recovery.source`` (bootstrap.recovery) or ``archive``
(the cluster's own, for a rehearsal)."""

LOG_LINES = 40
"""How many of PostgreSQL's last log lines a failed recovery keeps to explain itself."""


class RestoreError(RuntimeError):
    """The restore cannot go on; the message says why (never a secret)."""


@dataclass(frozen=True)
class BackupInfo:
    """One base backup as ``barman-cloud-backup-list --format json`` lists it."""

    backup_id: str
    status: str
    begin_time: datetime | None
    end_time: datetime | None
    end_lsn: str | None
    timeline: int | None
    data_checksums: bool | None
    major: int | None = None
    """The PostgreSQL major it is a backup of (barman's ``version``), when listed."""
    server_name: str = ""
    """The server name it is stored under (set by :func:`list_backups`)."""


def _time(raw: Any) -> datetime | None:
    return datetime.fromisoformat(raw) if isinstance(raw, str) and raw else None


def _major(version: Any) -> int | None:
    """barman's ``version`` (``server_version_num``, 150019) as the major (15)."""
    return int(version) // 10000 if isinstance(version, int) and version >= 100000 else None


def systems(source: ArchiveTarget, major: int | None) -> list[ArchiveTarget]:
    """Where the source's backups of PostgreSQL ``major`` may be: its own server name and, unless that already names
    one, the system a major upgrade to ``major`` made (``<cluster>.pg<major>``, kanri.postgres.backup.archiving): a
    major upgrade moves a cluster's archive to a folder of its own."""
    if "." in source.server_name or major is None:
        return [source]
    return [source, source.system(f"{source.server_name}.pg{major}")]


def parse_backup_list(raw: str) -> list[BackupInfo]:
    """The backups in barman's JSON listing, oldest first; RestoreError when it is not that document."""
    try:
        items = json.loads(raw)["backups_list"]
    except (ValueError, KeyError, TypeError):
        raise RestoreError("barman-cloud-backup-list did not answer a backup list") from None
    found = []
    for item in items:
        checksums = item.get("data_checksums")
        found.append(
            BackupInfo(
                backup_id=str(item["backup_id"]),
                status=str(item.get("status") or ""),
                begin_time=_time(item.get("begin_time_iso")),
                end_time=_time(item.get("end_time_iso")),
                end_lsn=item.get("end_xlog"),
                timeline=int(item["timeline"]) if item.get("timeline") is not None else None,
                data_checksums=None if checksums is None else str(checksums).lower() in ("on", "true", "1"),
                major=_major(item.get("version")),
            )
        )
    return sorted(found, key=lambda b: (b.end_time is None, b.end_time or datetime.min, b.backup_id))


def lsn_value(lsn: str) -> int:
    """``16/B374D848`` as a number (to compare LSNs)."""
    high, low = lsn.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def choose_backup(backups: list[BackupInfo], plan: RecoveryPlan, major: int | None = None) -> BackupInfo:
    """The backup to restore: the one the plan names (it must be complete), else the newest complete one that ended
    before the target time or LSN (replay can only go forward from a backup's end), else the newest complete one.
    ``major``: only backups of that PostgreSQL major can be restored here (the others are said in the error)."""
    backups = sorted(backups, key=lambda b: (b.end_time is None, b.end_time or datetime.min, b.backup_id))
    where = f"{plan.source.destination}/{plan.source.server_name}"
    if major is not None:
        others = sorted({b.major for b in backups if b.major is not None and b.major != major})
        backups = [b for b in backups if b.major in (None, major)]
        if others:
            where += f" (only backups of PostgreSQL {major}; backups of {', '.join(map(str, others))} are there too)"
    done = [b for b in backups if b.status == "DONE"]
    if plan.backup is not None:
        named = next((b for b in backups if b.backup_id == plan.backup), None)
        if named is None:
            raise RestoreError(f"backup {plan.backup} is not in {where}")
        if named.status != "DONE":
            raise RestoreError(f"backup {plan.backup} in {where} is {named.status or 'unfinished'}, not DONE")
        return named
    candidates = done
    if plan.target_time is not None:
        target = plan.target_time
        candidates = [b for b in done if b.end_time is not None and b.end_time < target]
        if not candidates:
            raise RestoreError(f"no complete backup in {where} ended before {target.isoformat()}")
    elif plan.target_lsn is not None:
        wanted = lsn_value(plan.target_lsn)
        candidates = [b for b in done if b.end_lsn is not None and lsn_value(b.end_lsn) <= wanted]
        if not candidates:
            raise RestoreError(f"no complete backup in {where} ended before LSN {plan.target_lsn}")
    if not candidates:
        raise RestoreError(f"no complete backup in {where}")
    return candidates[-1]


# --- the files ---------------------------------------------------------------------------------------------------


def restore_command(source: Source, python: str = sys.executable, server: str | None = None) -> str:
    """The ``restore_command`` PostgreSQL runs for each WAL file and timeline history it needs; ``server``: the
    server name of the chosen backup when it is not the source's own (a system a major upgrade made)."""
    command = f"{shlex.quote(python)} -m kanri.instance restore-wal {source} %f %p"
    return command if server is None else f"{command} {shlex.quote(server)}"


def _recovery_time(moment: datetime) -> str:
    """A ``recovery_target_time`` PostgreSQL parses: ``2026-12-02 07:10:00.123456+00:00``."""
    return moment.isoformat(sep=" ")


def recovery_parameters(
    plan: RecoveryPlan, source: Source, python: str = sys.executable, server: str | None = None
) -> dict[str, str]:
    """The recovery keys: restore from the source, stop at the plan's target (none: the end of the archive), then
    promote. ``recovery_target_timeline = latest`` follows the source's failovers (within the one PostgreSQL system
    ``server`` names: another system's timelines are in a folder of their own)."""
    params = {
        "restore_command": restore_command(source, python, server),
        "recovery_target_action": "promote",
        "recovery_target_timeline": "latest",
    }
    if plan.target_time is not None:
        params["recovery_target_time"] = _recovery_time(plan.target_time)
        params["recovery_target_inclusive"] = "on"  # a commit at exactly the target is kept
    elif plan.target_lsn is not None:
        params["recovery_target_lsn"] = plan.target_lsn
    elif plan.target_immediate:
        params["recovery_target"] = "immediate"
    return params


def recovery_conf(base: str, recovery: Mapping[str, str]) -> str:
    """The staging postgresql.conf: the manager's file (``base``), then the recovery keys and the restore's own
    settings, which come later and so win: nobody connects over TCP, and no hot standby (its parameter checks
    against the source's max_connections and the like do not apply; the server only has to replay), and no
    synchronous standby to wait for (there is none while restoring)."""
    lines = [base.rstrip("\n"), "", "# restore (kanri.instance.restore): removed once the recovery has ended"]
    overrides = {"listen_addresses": "", "hot_standby": "off", "synchronous_standby_names": "", **recovery}
    lines += [f"{key} = {quote(value)}" for key, value in overrides.items()]
    return "\n".join(lines) + "\n"


def wal_restore_argv(target: ArchiveTarget, wal_name: str, destination: str, env: Mapping[str, str]) -> list[str]:
    """``barman-cloud-wal-restore`` for one WAL file or history file of ``target``'s server."""
    return [
        barman_program("barman-cloud-wal-restore", env),
        *cloud_options(target),
        target.destination,
        target.server_name,
        wal_name,
        destination,
    ]


def credentials_dir(source: Source, env: Mapping[str, str]) -> Path:
    """The mounted key files for ``source``'s repository."""
    if source == "recovery":
        return Path(env.get("KANRI_RECOVERY_CREDENTIALS_DIR") or RECOVERY_CREDENTIALS_DIR)
    return Path(env.get("KANRI_BACKUP_CREDENTIALS_DIR") or DEFAULT_CREDENTIALS_DIR)


def source_target(config: ClusterConfig, source: Source) -> ArchiveTarget | None:
    """The repository ``source`` names in the cluster config (None: absent)."""
    if source == "recovery":
        return config.recovery.source if config.recovery is not None else None
    return config.archive


def restore_wal(
    source: Source, wal_name: str, destination: str, env: Mapping[str, str] | None = None, server: str | None = None
) -> int:
    """``restore_command``: fetch one file from the source repository (``server``: from that system of the source,
    see :func:`systems`); the exit code PostgreSQL reads (non-zero: not there, which ends archive recovery)."""
    env = os.environ if env is None else env
    config_file = Path(env.get("KANRI_CONFIG_FILE") or "/etc/kanri/config/instance.json")
    try:
        target = source_target(ClusterConfig.parse(config_file.read_bytes()), source)
        if target is not None and server is not None:
            target = target.system(server)
    except (OSError, ValueError) as exc:
        print(f"kanri restore-wal: cannot read the cluster config: {exc}", file=sys.stderr)
        return 1
    if target is None:
        print(f"kanri restore-wal: the cluster config has no {source} repository", file=sys.stderr)
        return 1
    directory = credentials_dir(source, env)
    try:
        secrets = read_credentials(directory, target.region)
    except OSError as exc:
        print(f"kanri restore-wal: repository credentials unreadable: {exc.strerror} ({directory})", file=sys.stderr)
        return 1
    argv = wal_restore_argv(target, wal_name, destination, env)
    try:
        return subprocess.run(argv, env={**env, **secrets}, stdin=subprocess.DEVNULL, check=False).returncode
    except OSError as exc:
        print(f"kanri restore-wal: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 1


# --- running it --------------------------------------------------------------------------------------------------


async def _barman(argv: list[str], secrets: Mapping[str, str]) -> tuple[int, str, str]:
    """Run a Barman Cloud program with the key pair in its environment: exit code, stdout, stderr's last lines."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **secrets},
        )
    except OSError as exc:
        return 127, "", f"cannot run {argv[0]}: {exc.strerror}"
    try:
        out, err = await proc.communicate()
    except asyncio.CancelledError:
        proc.terminate()
        await proc.wait()
        raise
    text = err.decode(errors="replace")
    sys.stderr.write(text)
    sys.stderr.flush()
    return proc.returncode or 0, out.decode(errors="replace"), " ".join(text.strip().splitlines()[-3:])


async def list_backups(target: ArchiveTarget, secrets: Mapping[str, str]) -> list[BackupInfo]:
    """The server's backups in the repository (oldest first)."""
    argv = [
        barman_program("barman-cloud-backup-list"),
        *cloud_options(target),
        "--format",
        "json",
        target.destination,
        target.server_name,
    ]
    code, out, tail = await _barman(argv, secrets)
    if code != 0 or not out.strip():
        raise RestoreError(f"cannot list the backups of {target.server_name} in {target.destination}: "
                           f"{tail or f'exit code {code}'}")  # fmt: skip
    return [dataclasses.replace(b, server_name=target.server_name) for b in parse_backup_list(out)]


def _make_dir(path: Path) -> None:
    path.mkdir(mode=0o700)


async def fetch_backup(target: ArchiveTarget, backup: BackupInfo, into: Path, secrets: Mapping[str, str]) -> None:
    """``barman-cloud-restore`` of ``backup`` into the (new, empty) directory ``into``."""
    _make_dir(into)
    argv = [
        barman_program("barman-cloud-restore"),
        *cloud_options(target),
        target.destination,
        target.server_name,
        backup.backup_id,
        str(into),
    ]
    log.info("fetching the base backup", backup=backup.backup_id, server=target.server_name)
    code, _, tail = await _barman(argv, secrets)
    if code != 0:
        raise RestoreError(f"barman-cloud-restore of backup {backup.backup_id} failed: {tail or f'exit code {code}'}")


LEFTOVERS = ("standby.signal", "recovery.signal", "postmaster.pid", "postmaster.opts", "backup_label.old")
"""Files a backup may carry that must not steer the restored server (a backup of a standby has standby.signal)."""


@dataclass(frozen=True)
class RecoveryOutcome:
    """Where the recovery ended."""

    lsn: str
    """The WAL position after promotion (the new timeline's start)."""
    timeline: int
    recovered_to: datetime | None
    """The commit time of the last transaction replayed (None: none was replayed beyond the backup)."""
    consistent_at: str | None
    """The LSN at which PostgreSQL logged that the data was consistent."""
    log_tail: tuple[str, ...] = ()


class Recovery:
    """PostgreSQL replaying a restored directory until it promotes itself; its log goes to our stderr and its last
    lines are kept (they say why a recovery stopped short)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.process: asyncio.subprocess.Process | None = None
        self.lines: collections.deque[str] = collections.deque(maxlen=LOG_LINES)
        self.consistent_at: str | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.settings.socket_dir.mkdir(parents=True, exist_ok=True)
        self.process = await asyncio.create_subprocess_exec(
            self.settings.binary("postgres"),
            "-D",
            str(self.settings.pgdata),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        self._reader = asyncio.create_task(self._read(self.process))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            sys.stderr.write(line + "\n")
            self.lines.append(line)
            if "consistent recovery state reached at" in line:
                self.consistent_at = line.rsplit(" ", 1)[-1]

    def failure(self) -> str:
        """The lines that say why PostgreSQL stopped (FATAL/PANIC first), for the error message."""
        fatal = [line.split("FATAL:", 1)[-1].strip() for line in self.lines if "FATAL:" in line or "PANIC:" in line]
        return "; ".join(fatal[-2:]) or (self.lines[-1] if self.lines else "no log")

    async def wait_promoted(self) -> RecoveryOutcome:
        """Return once the server has ended recovery and accepts connections; RestoreError when it exits first."""
        proc = self.process
        assert proc is not None
        while True:
            if proc.returncode is not None:
                if self._reader is not None:
                    await self._reader  # the last lines, which say why
                raise RestoreError(f"PostgreSQL stopped before the end of recovery (exit code {proc.returncode}): "
                                   f"{self.failure()}")  # fmt: skip
            try:
                conn = await connect(self.settings, timeout=2)
            except psycopg.OperationalError:
                await asyncio.sleep(0.3)
                continue
            async with conn:
                row = await fetch_one(
                    conn,
                    "SELECT pg_is_in_recovery() AS r, pg_last_xact_replay_timestamp() AS t,"
                    " (SELECT timeline_id FROM pg_control_checkpoint()) AS tli,"
                    " CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_lsn()::text END AS lsn",
                )
                if row["r"]:
                    await asyncio.sleep(0.3)
                    continue
                # the checkpoint's timeline lags until the end-of-recovery checkpoint: take the WAL's own
                tli = await fetch_one(conn, "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))"
                                      "::bit(32)::int AS tli")  # fmt: skip
            return RecoveryOutcome(str(row["lsn"]), int(tli["tli"] or row["tli"]), row["t"], self.consistent_at,
                                   tuple(self.lines))  # fmt: skip

    async def stop(self) -> None:
        """Fast shutdown (a clean shutdown checkpoint: pg_checksums and the next start need one)."""
        proc = self.process
        if proc is not None and proc.returncode is None:
            proc.send_signal(2)  # SIGINT: fast shutdown
            try:
                async with asyncio.timeout(120):
                    await proc.wait()
            except TimeoutError:
                proc.send_signal(3)  # SIGQUIT
                await proc.wait()
        if self._reader is not None:
            await self._reader


def staging_settings(settings: Settings, staging: Path) -> Settings:
    """The settings of the server that runs in the staging directory."""
    return dataclasses.replace(settings, pgdata=staging)


async def prepare(
    settings: Settings,
    config: ClusterConfig,
    plan: RecoveryPlan,
    source: Source,
    staging: Path,
    *,
    archive: bool,
    on_progress: Callable[[str], None] = lambda _: None,
) -> BackupInfo:
    """Steps 1 and 2 (see the module docstring) into ``staging``, which must not exist. ``archive``: whether the
    restored server archives (into the cluster config's own ``archive`` target) once it has promoted."""
    directory = credentials_dir(source, os.environ)
    try:
        secrets = read_credentials(directory, plan.source.region)
    except OSError as exc:
        problem = f"{exc.strerror} ({directory})"
        raise RestoreError(f"the source repository's credentials are unreadable: {problem}") from None
    major = await binary_version(settings.binary("postgres"))
    places = systems(plan.source, major)
    on_progress(f"listing the backups of {', '.join(p.server_name for p in places)}")
    found: list[BackupInfo] = []
    for place in places:
        found += await list_backups(place, secrets)
    backup = choose_backup(found, plan, major)
    chosen = next((p for p in places if p.server_name == backup.server_name), plan.source)
    on_progress(f"fetching backup {backup.backup_id} of {chosen.server_name}")
    await fetch_backup(chosen, backup, staging, secrets)
    for name in LEFTOVERS:
        (staging / name).unlink(missing_ok=True)
    staged = staging_settings(settings, staging)
    own = config if archive else config.model_copy(update={"archive": None})
    base = render_postgresql_conf(staged, own, {}, replica=False, replication=None)
    server = None if chosen.server_name == plan.source.server_name else chosen.server_name
    parameters = recovery_parameters(plan, source, server=server)
    write_if_changed(staging / "postgresql.conf", recovery_conf(base, parameters))
    write_if_changed(staging / "pg_hba.conf", render_hba(None))
    (staging / "recovery.signal").touch(mode=0o600)
    return backup


async def restore_primary(
    settings: Settings, config: ClusterConfig, staging: Path, *, on_progress: Callable[[str], None] = lambda _: None
) -> tuple[BackupInfo, RecoveryOutcome]:
    """A new cluster's primary from ``config.recovery``: restore into ``staging``, replay to the target, promote, shut
    down cleanly. The caller moves ``staging`` into place; the manager's files replace the restore's at the next
    start, and the manager's upkeep sets the roles' passwords from this cluster's Secrets as after an initdb."""
    plan = config.recovery
    if plan is None:
        raise RestoreError("the cluster config has no recovery entry")
    backup = await prepare(settings, config, plan, "recovery", staging, archive=True, on_progress=on_progress)
    on_progress(f"replaying WAL from backup {backup.backup_id}: {plan.describe()}")
    recovery = Recovery(staging_settings(settings, staging))
    await recovery.start()
    try:
        outcome = await recovery.wait_promoted()
    finally:
        await recovery.stop()
    # what the promoted server has not archived yet waits in archive_status (.ready) for the manager's server
    (staging / "recovery.signal").unlink(missing_ok=True)
    log.info("restored", backup=backup.backup_id, timeline=outcome.timeline, lsn=outcome.lsn,
             recovered_to=outcome.recovered_to.isoformat() if outcome.recovered_to else None)  # fmt: skip
    return backup, outcome


def remove(path: Path) -> None:
    """Remove a staging directory (quietly: it may be half-written)."""
    shutil.rmtree(path, ignore_errors=True)
