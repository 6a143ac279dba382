"""``kanri-instance upgrade``: the major upgrade of the primary's data directory, in a one-off pod on its volume.

The operator runs it only with every instance stopped (the cluster's downtime). Steps, each recorded in
``<volume>/kanri-upgrade/state.json`` before it acts, so a pod started again never runs pg_upgrade twice on one data
directory:

0. with a repository configured, the old server is started with its own archiving on, its current WAL segment is
   closed (``pg_switch_wal()``) and the step waits until no segment waits to be archived: the commits made between
   the last archived segment and the stop for the upgrade would otherwise exist only in the old ``pg_wal``, which
   pg_upgrade discards — and the old system's archive must reach the moment of the upgrade (the way back). Not
   archived within ``ARCHIVE_WAIT`` seconds: the pod fails before anything changed;
1. the old server is started once on its unix socket and stopped cleanly (pg_upgrade needs a clean shutdown, and it
   tells the encoding and locale the new cluster must have); checksums come from pg_controldata;
2. ``initdb`` of the new major in ``pgdata.kanri-upgrade`` beside PGDATA (the same filesystem: ``--link``);
3. state ``linking``; ``pg_upgrade --link`` with the new major's own pg_upgrade;
4. state ``linked``; PGDATA becomes ``pgdata.kanri-old``, the new cluster becomes PGDATA; state ``swapped``; the old
   directory is removed (after ``--link`` it can no longer be started); state ``done``.

Found at start: ``linking`` means an earlier pg_upgrade was interrupted. If pg_upgrade had renamed the old
``global/pg_control`` to ``pg_control.old`` (it does so just before linking) the old directory must not be started
any more: the pod fails and says so (the way back is the pre-upgrade backup). Otherwise the old directory is intact:
the pod fails too, without touching it, and the operator records Failed (nothing is retried until the spec changes).
``linked``/``swapped`` are finished; ``done`` (or data already of the new major) is success.

After the swap ``post-upgrade.json`` asks the instance manager of the new primary to rebuild the statistics
(``vacuumdb --analyze-in-stages``) and run ``update_extensions.sql`` when pg_upgrade wrote one
(:mod:`kanri.instance.post_upgrade`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import structlog

from kanri.instance.config import ClusterConfig, Settings
from kanri.instance.identity import data_version
from kanri.instance.tls import install as install_tls
from kanri.instance.upgrade_tools import (
    UPGRADE_PORT_NEW,
    UPGRADE_PORT_OLD,
    InitdbSettings,
    UpgradeError,
    bin_dir,
    checksums_enabled,
    controldata,
    initdb,
    run_tool,
    temporary_server,
    upgrade_pod,
    verdict,
)

__all__ = ["POST_UPGRADE", "WORK_DIR", "main", "upgrade"]

log = structlog.get_logger("kanri.instance.major_upgrade")
WORK_DIR = "kanri-upgrade"
"""Beside PGDATA on the volume: the state file, pg_upgrade's scripts and logs."""
POST_UPGRADE = "post-upgrade.json"
ARCHIVE_WAIT = 300.0
"""How long step 0 waits for the old system's last WAL to reach the repository."""


def _work(settings: Settings) -> Path:
    return settings.pgdata.parent / WORK_DIR


def _staging(settings: Settings) -> Path:
    return settings.pgdata.with_name(settings.pgdata.name + ".kanri-upgrade")


def _aside(settings: Settings) -> Path:
    return settings.pgdata.with_name(settings.pgdata.name + ".kanri-old")


def _read_state(settings: Settings) -> dict[str, Any]:
    try:
        found = json.loads((_work(settings) / "state.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _write_state(settings: Settings, **state: Any) -> None:
    work = _work(settings)
    work.mkdir(parents=True, exist_ok=True)
    tmp = work / "state.json.tmp"
    with tmp.open("w") as handle:
        json.dump(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, work / "state.json")


async def _query(bindir: Path, socket: Path, sql: str) -> str:
    code, text = await run_tool([str(bindir / "psql"), "-X", "-A", "-t", "-h", str(socket), "-p",
                                 str(UPGRADE_PORT_OLD), "-U", "postgres", "-d", "postgres", "-c", sql],
                                echo=False)  # fmt: skip
    if code != 0:
        raise UpgradeError(f"could not query the old server: {text.strip()[-400:]}")
    return text.strip()


def _archives(settings: Settings) -> bool:
    """Whether the cluster config names a repository (then the old server archives, as it did while it ran)."""
    try:
        return ClusterConfig.parse(settings.config_file.read_bytes()).archive is not None
    except FileNotFoundError:  # outside a pod (tests, benchmarks): a pod always has its ConfigMap mounted
        return False
    except (OSError, ValueError) as exc:
        raise UpgradeError(f"cannot read the cluster config {settings.config_file}: {exc}") from None


async def _archive_last_wal(bindir: Path, settings: Settings, socket: Path) -> str:
    """Step 0: the old system's last segment closed and archived; its name."""
    async with temporary_server(bindir, settings.pgdata, socket, UPGRADE_PORT_OLD):  # its own archive settings
        last = await _query(bindir, socket, "SELECT pg_walfile_name(pg_switch_wal())")
        deadline = time.monotonic() + ARCHIVE_WAIT
        waiting = "SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready'"
        while (left := await _query(bindir, socket, waiting)) != "0":
            if time.monotonic() > deadline:
                failed = await _query(bindir, socket, "SELECT coalesce(last_failed_wal, '-') || ' at ' || "
                                      "coalesce(last_failed_time::text, '-') FROM pg_stat_archiver")  # fmt: skip
                raise UpgradeError(f"the old system's last WAL could not be archived within {ARCHIVE_WAIT:.0f} s "
                                   f"({left} segments waiting; last failure: {failed}): nothing was changed and the "
                                   "instances start again on the old major; fix archiving (condition "
                                   "ContinuousArchiving), then change the spec to try again")  # fmt: skip
            await asyncio.sleep(0.5)
    log.info("the old system's last WAL is archived", wal=last)
    return last


async def _template_settings(bindir: Path, settings: Settings, socket: Path) -> InitdbSettings:
    """Start the old server once (a clean shutdown follows) and read template0's encoding and locale."""
    fields = await controldata(bindir, settings.pgdata)
    query = "select pg_encoding_to_char(encoding), datcollate, datctype from pg_database where datname = 'template0'"
    async with temporary_server(bindir, settings.pgdata, socket, UPGRADE_PORT_OLD, "-c archive_mode=off"):
        code, text = await run_tool([str(bindir / "psql"), "-X", "-A", "-t", "-F", "|", "-h", str(socket), "-p",
                                     str(UPGRADE_PORT_OLD), "-U", "postgres", "-d", "postgres", "-c", query],
                                    echo=False)  # fmt: skip
    if code != 0:
        raise UpgradeError(f"could not read the old cluster's encoding: {text.strip()[-400:]}")
    encoding, collate, ctype = text.strip().split("|")
    return InitdbSettings(encoding, collate, ctype, checksums_enabled(fields))


def _finish(settings: Settings, state: dict[str, Any]) -> None:
    """Steps 4 on: swap the directories and remove the old one (each part skipped when done already)."""
    staging, aside = _staging(settings), _aside(settings)
    if state.get("step") == "linked":
        if staging.exists():
            if settings.pgdata.exists():
                os.replace(settings.pgdata, aside)
            os.replace(staging, settings.pgdata)
        state = {**state, "step": "swapped"}
        _write_state(settings, **state)
    if state.get("step") == "swapped":
        shutil.rmtree(aside, ignore_errors=True)
        _write_state(settings, **{**state, "step": "done"})


async def upgrade(settings: Settings, old: int, new: int, env: dict[str, str]) -> dict[str, Any]:
    """The steps of the module docstring; returns the verdict's extra fields; raises UpgradeError."""
    if (resumed := _earlier_attempt(settings, old, new)) is not None:
        return resumed
    found = data_version(settings.pgdata)
    if found == new:
        return {"resumed": "already upgraded"}
    if found != old:
        raise UpgradeError(f"the data directory is PostgreSQL {found}, not {old}: not upgrading")
    old_bin, new_bin = bin_dir(old, env), settings.pg_bin
    if new_bin is None:
        raise UpgradeError("KANRI_PG_BIN is not set: no new major's programs")
    install_tls(settings)  # the old postgresql.conf names the installed certificate files
    work = _work(settings)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    socket = settings.socket_dir
    last_wal = await _archive_last_wal(old_bin, settings, socket) if _archives(settings) else None
    initdb_settings = await _template_settings(old_bin, settings, socket)
    staging = _staging(settings)
    shutil.rmtree(staging, ignore_errors=True)
    await initdb(new_bin, new, staging, initdb_settings)
    _write_state(settings, **{"from": old, "to": new, "step": "linking"})
    started = time.monotonic()
    code, text = await run_tool(_pg_upgrade_argv(old_bin, new_bin, settings.pgdata, staging, socket), cwd=work, env=env)
    if code != 0:
        linked = (settings.pgdata / "global" / "pg_control.old").exists()
        if not linked:  # nothing of the old directory changed: forget the attempt, keep its log
            (work / "state.json").unlink(missing_ok=True)
            shutil.rmtree(staging, ignore_errors=True)
        raise UpgradeError(f"pg_upgrade --link failed with code {code}" + (
            " after it began linking: restore the pre-upgrade backup" if linked else
            f" before linking: PostgreSQL {old} data is intact") + ": " + _tail(text))  # fmt: skip
    took = time.monotonic() - started
    # pg_upgrade keeps the data but not the system identifier: the new cluster's initdb made a new one, which the
    # operator records (the instances refuse a data directory of another system)
    identifier = (await controldata(new_bin, staging)).get("Database system identifier", "")
    _write_state(settings, **{"from": old, "to": new, "step": "linked", "systemIdentifier": identifier})
    extensions = work / "update_extensions.sql"
    post = {"to": new, "analyze": True, "updateExtensions": str(extensions) if extensions.exists() else None}
    (work / POST_UPGRADE).write_text(json.dumps(post))
    _finish(settings, {"from": old, "to": new, "step": "linked", "systemIdentifier": identifier})
    result: dict[str, Any] = {"pgUpgradeSeconds": round(took, 1), "updateExtensions": extensions.exists(),
                              "initdb": initdb_settings.describe(), "systemIdentifier": identifier}  # fmt: skip
    if last_wal is not None:
        result["lastArchivedWal"] = last_wal
    return result


def _earlier_attempt(settings: Settings, old: int, new: int) -> dict[str, Any] | None:
    """The verdict of an earlier attempt that got far enough (finished now); UpgradeError for one interrupted while
    pg_upgrade ran; None when there is none."""
    state = _read_state(settings)
    if state.get("to") == new and state.get("step") in ("linked", "swapped", "done"):
        _finish(settings, state)
        return {"resumed": state.get("step"), "systemIdentifier": state.get("systemIdentifier")}
    if state.get("step") == "linking":
        if (settings.pgdata / "global" / "pg_control.old").exists():
            raise UpgradeError(
                "an earlier pg_upgrade --link was interrupted after it began linking: the old data directory must "
                "not be started again; restore the pre-upgrade backup into a new cluster (docs/postgres-operator.md "
                "'Major upgrades')"
            )
        raise UpgradeError(
            "an earlier pg_upgrade was interrupted before it began linking: the old data directory is intact and "
            f"the cluster goes on with PostgreSQL {old}; change the spec to try again"
        )
    return None


def _pg_upgrade_argv(old_bin: Path, new_bin: Path, pgdata: Path, staging: Path, socket: Path) -> list[str]:
    """``pg_upgrade --link`` from ``pgdata`` into ``staging``; archiving off on both sides while it runs."""
    return [
        str(new_bin / "pg_upgrade"),
        "--old-bindir", str(old_bin), "--new-bindir", str(new_bin),
        "--old-datadir", str(pgdata), "--new-datadir", str(staging),
        "--link", "--username", "postgres", "--socketdir", str(socket),
        "--old-port", str(UPGRADE_PORT_OLD), "--new-port", str(UPGRADE_PORT_NEW),
        "--old-options", "-c archive_mode=off", "--new-options", "-c archive_mode=off",
    ]  # fmt: skip


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(line for line in text.strip().splitlines()[-lines:] if line.strip())


def main(env: dict[str, str] | None = None) -> int:
    """``kanri-instance upgrade``: ``KANRI_UPGRADE_FROM``/``KANRI_UPGRADE_TO``; the verdict is the termination
    message; 0 on success."""
    if (pod := upgrade_pod(env)) is None:
        return 2
    settings, old, new, environ, termination = pod.settings, pod.old, pod.new, pod.environ, pod.termination
    started = time.monotonic()
    try:
        extra = asyncio.run(upgrade(settings, old, new, environ))
    except (UpgradeError, OSError) as exc:
        log.error("major upgrade failed", error=str(exc)[:500])
        verdict("Failed", str(exc), termination, durationSeconds=round(time.monotonic() - started, 1))
        return 1
    message = f"the data directory was upgraded from PostgreSQL {old} to {new} with pg_upgrade --link"
    log.info("major upgrade done", **{k: v for k, v in extra.items() if k != "initdb"})
    verdict("Succeeded", message, termination, durationSeconds=round(time.monotonic() - started, 1), **extra)
    return 0
