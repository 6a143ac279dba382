"""An empty PGDATA becomes a data directory: initdb for a new primary (or a restore from another cluster's backups,
:func:`recover`), pg_basebackup for a replica.

Both build into a sibling directory (``<PGDATA>.kanri-new``) that is renamed into place only when complete, so a pod
killed halfway leaves nothing that looks like a data directory. A replica clones through its own replication slot,
which the primary creates once the instance is listed in ``instances``; until then (and while the primary is not
reachable) the clone is retried with back-off. pg_basebackup fails fast on a missing slot, so waiting costs nothing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import structlog

from kanri.instance.conf import render_passfile, slot_name, write_if_changed
from kanri.instance.config import SUPERUSER, ClusterConfig, Credentials, Settings
from kanri.instance.restore import RestoreError, restore_primary
from kanri.instance.tls import client_env
from kanri.instance.tls import install as install_tls

log = structlog.get_logger("kanri.instance.bootstrap")


class BootstrapError(RuntimeError):
    """The data directory cannot be prepared (the message says why, never with a secret in it)."""


def has_data(pgdata: Path) -> bool:
    """A data directory is there (PG_VERSION is the marker initdb and pg_basebackup both write)."""
    return (pgdata / "PG_VERSION").is_file()


async def _run(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run a PostgreSQL tool; its output goes to our stderr as well, the tail comes back for error messages."""
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    try:
        out, _ = await proc.communicate()
    except asyncio.CancelledError:
        proc.terminate()  # shutdown while cloning: do not leave the tool running
        await proc.wait()
        raise
    text = out.decode(errors="replace")
    sys.stderr.write(text)
    sys.stderr.flush()
    return proc.returncode or 0, "\n".join(text.strip().splitlines()[-3:])


def _staging(settings: Settings) -> Path:
    return settings.pgdata.with_name(settings.pgdata.name + ".kanri-new")


def discard_partial(settings: Settings) -> None:
    """Remove what an interrupted bootstrap left next to PGDATA (it may be as large as a whole clone)."""
    if _staging(settings).exists():
        log.warning("removing an interrupted bootstrap", path=str(_staging(settings)))
        shutil.rmtree(_staging(settings), ignore_errors=True)


def _fresh_target(settings: Settings) -> Path:
    """The sibling directory to build in, emptied; and PGDATA's parent, created if needed."""
    if settings.pgdata.exists() and any(settings.pgdata.iterdir()):
        raise BootstrapError(f"{settings.pgdata} is not empty but holds no data directory (no PG_VERSION); refusing")
    target = _staging(settings)
    shutil.rmtree(target, ignore_errors=True)
    settings.pgdata.parent.mkdir(parents=True, exist_ok=True)
    return target


def _move_into_place(settings: Settings, target: Path) -> None:
    if settings.pgdata.exists():
        settings.pgdata.rmdir()  # empty (checked by _fresh_target)
    os.chmod(target, 0o700)
    os.replace(target, settings.pgdata)


async def initdb(settings: Settings, *, superuser: Credentials | None) -> None:
    """A new cluster: checksums on, peer locally, SCRAM over TCP, UTF8 with C collation, superuser ``postgres``.

    ``superuser`` is the checked superuser Secret (None: absent or refused; ``postgres`` then has no password)."""
    target = _fresh_target(settings)
    args = [
        settings.binary("initdb"),
        "--pgdata",
        str(target),
        "--data-checksums",
        "--auth-local=peer",
        "--auth-host=scram-sha-256",
        "--encoding=UTF8",
        "--lc-collate=C",
        "--lc-ctype=C",
        f"--username={SUPERUSER}",
    ]
    if superuser is not None:
        # the Secret's file itself (initdb reads its first line); the password is never in argv
        args.append(f"--pwfile={settings.superuser_dir / 'password'}")
    log.info("initdb", pgdata=str(settings.pgdata), checksums=True, superuser_password=superuser is not None)
    code, tail = await _run(args)
    if code != 0:
        shutil.rmtree(target, ignore_errors=True)
        raise BootstrapError(f"initdb failed with code {code}: {tail}")
    _move_into_place(settings, target)


async def clone(
    settings: Settings,
    replication: Callable[[], Credentials | None],
    *,
    on_error: Callable[[str], None] = lambda _: None,
    max_delay: float = 10.0,
) -> None:
    """Clone the primary with ``pg_basebackup -X stream -S <own slot>``, retrying until it succeeds.

    ``replication`` gives the checked replication Secret on each attempt (None while it is absent or refused: the
    clone waits for a usable one). Each failed attempt is passed to ``on_error``; cancel to give up (shutdown). The
    password travels in the passfile named by PGPASSFILE."""
    settings.socket_dir.mkdir(parents=True, exist_ok=True)
    install_tls(settings)  # before PostgreSQL ever started: the clone verifies the primary with the CA
    env = {**os.environ, "PGPASSFILE": str(settings.passfile), "PGAPPNAME": f"{settings.name}-clone"}
    env |= client_env(settings)
    delay = 1.0
    attempt = 0
    while True:
        attempt += 1
        credentials = replication()
        if credentials is None:
            on_error("cannot clone: the replication Secret is missing or invalid")
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)
            continue
        write_if_changed(settings.passfile, render_passfile(credentials))
        target = _fresh_target(settings)
        args = [
            settings.binary("pg_basebackup"),
            "--pgdata",
            str(target),
            "--host",
            settings.primary_host,
            "--port",
            str(settings.primary_port),
            "--username",
            credentials.username,
            "--no-password",
            "--wal-method=stream",
            "--checkpoint=fast",
            f"--slot={slot_name(settings.name)}",
        ]
        log.info("pg_basebackup", primary=f"{settings.primary_host}:{settings.primary_port}", attempt=attempt)
        code, tail = await _run(args, env)
        if code == 0:
            _move_into_place(settings, target)
            (settings.pgdata / "standby.signal").touch(mode=0o600)
            return
        shutil.rmtree(target, ignore_errors=True)
        missing_slot = "replication slot" in tail and "does not exist" in tail
        reason = "the primary has no slot for this instance yet" if missing_slot else tail
        on_error(f"pg_basebackup failed: {reason}")
        log.warning("pg_basebackup failed; retrying", attempt=attempt, retry_in=delay, reason=reason)
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay)


async def recover(
    settings: Settings,
    config: Callable[[], ClusterConfig],
    *,
    on_error: Callable[[str], None] = lambda _: None,
    on_progress: Callable[[str], None] = lambda _: None,
    max_delay: float = 30.0,
) -> None:
    """A new cluster's primary from another cluster's backups (``recovery`` in the cluster config; see
    :mod:`kanri.instance.restore`), retrying with back-off: the first attempt may come before the source's key pair
    is mounted or its first backup exists. ``config`` gives the current cluster config on each attempt."""
    delay = 2.0
    attempt = 0
    while True:
        attempt += 1
        target = _fresh_target(settings)
        try:
            backup, outcome = await restore_primary(settings, config(), target, on_progress=on_progress)
        except RestoreError as exc:
            shutil.rmtree(target, ignore_errors=True)
            on_error(f"restore failed: {exc}")
            log.warning("restore failed; retrying", attempt=attempt, retry_in=delay, reason=str(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)
            continue
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        _move_into_place(settings, target)
        on_progress(f"restored backup {backup.backup_id}; promoted on timeline {outcome.timeline} at {outcome.lsn}")
        return
