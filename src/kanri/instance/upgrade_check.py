"""``kanri-instance upgrade-check``: ``pg_upgrade --check`` against a scratch copy of the catalog, while the cluster
keeps serving.

pg_upgrade's checks read the catalog (data types of user columns, extensions and their libraries, roles,
encodings), not the table data. So the copy is the schema only: ``pg_dumpall --schema-only`` of the primary (over
TLS as the superuser, with the old major's own pg_dumpall so the old major can read it back) restored into a new
cluster of the old major made with the primary's encoding, locale and checksum setting; then an empty cluster of the
new major, and the new major's ``pg_upgrade --check`` between the two. Everything lives in the pod's emptyDir.

Checked on the live primary first, because these builds have no ICU: a database or collation with the ICU provider
cannot be carried over. The verdict (Succeeded, or Failed with pg_upgrade's own explanation and the list it wrote of
the offending objects) is the pod's termination message.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import structlog

from kanri.instance.config import Settings
from kanri.instance.tls import client_env
from kanri.instance.tls import install as install_tls
from kanri.instance.upgrade_tools import (
    UPGRADE_PORT_NEW,
    UPGRADE_PORT_OLD,
    InitdbSettings,
    UpgradeError,
    bin_dir,
    initdb,
    run_tool,
    temporary_server,
    upgrade_pod,
    verdict,
)

__all__ = ["check", "main"]

log = structlog.get_logger("kanri.instance.upgrade_check")


def _passfile(settings: Settings, scratch: Path) -> Path:
    """A libpq passfile with the superuser's password (never an argument, never in the environment)."""
    password = (settings.superuser_dir / "password").read_text().splitlines()[0]
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    path = scratch / "pgpass"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"*:*:*:postgres:{escaped}\n")
    return path


async def _query(bindir: Path, env: dict[str, str], sql: str) -> list[list[str]]:
    code, text = await run_tool([str(bindir / "psql"), "-X", "-A", "-t", "-F", "|", "-d", "postgres", "-c", sql],
                                env=env, echo=False)  # fmt: skip
    if code != 0:
        raise UpgradeError(f"cannot query the primary: {text.strip()[-500:]}")
    return [line.split("|") for line in text.strip().splitlines() if line]


async def _live_settings(bindir: Path, env: dict[str, str], old: int) -> InitdbSettings:
    """The primary's template0 encoding and locale and its checksum setting; Failed on ICU (the builds lack it)."""
    (row,) = await _query(bindir, env, "select pg_encoding_to_char(encoding), datcollate, datctype, "
                          "current_setting('data_checksums') from pg_database where datname = 'template0'")  # fmt: skip
    icu = await _query(bindir, env, "select collname from pg_collation where collprovider = 'i' and oid >= 16384")
    if old >= 15:
        icu += await _query(bindir, env, "select 'database ' || datname from pg_database where datlocprovider = 'i'")
    if icu:
        names = ", ".join(r[0] for r in icu[:10])
        raise UpgradeError(f"ICU collations are in use ({names}); these PostgreSQL builds have no ICU, so they "
                           "cannot be upgraded: drop them or move the data with a dump")  # fmt: skip
    return InitdbSettings(row[0], row[1], row[2], row[3] == "on")


def _reports(work: Path) -> str:
    """The object lists pg_upgrade --check writes next to its failures (``tables_using_reg.txt`` ...)."""
    found = []
    for path in sorted(work.rglob("*.txt")):
        if path.name.startswith("pg_upgrade_"):
            continue  # its own logs, long and mostly noise
        found.append(f"{path.name}: " + " ".join(path.read_text(errors="replace").split())[:600])
    return "\n".join(found)


def _prepare(scratch: Path) -> None:
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "work").mkdir(exist_ok=True)


async def check(settings: Settings, old: int, new: int, env: dict[str, str], scratch: Path) -> str:
    """The steps of the module docstring; returns a summary; raises UpgradeError with pg_upgrade's reasons."""
    old_bin, new_bin = bin_dir(old, env), settings.pg_bin
    if new_bin is None:
        raise UpgradeError("KANRI_PG_BIN is not set: no new major's programs")
    _prepare(scratch)
    install_tls(settings)
    remote = {**env, **client_env(settings), "PGHOST": settings.primary_host, "PGPORT": str(settings.primary_port),
              "PGUSER": "postgres", "PGPASSFILE": str(_passfile(settings, scratch))}  # fmt: skip
    for key in ("PGDATA",):
        remote.pop(key, None)
    wanted = await _live_settings(old_bin, remote, old)
    dump = scratch / "schema.sql"
    code, text = await run_tool([str(old_bin / "pg_dumpall"), "--schema-only", "--no-role-passwords", "-f",
                                 str(dump)], env=remote)  # fmt: skip
    if code != 0:
        raise UpgradeError(f"pg_dumpall --schema-only of the primary failed: {text.strip()[-800:]}")
    old_dir, new_dir, work = scratch / "old", scratch / "new", scratch / "work"
    await initdb(old_bin, old, old_dir, wanted)
    socket = settings.socket_dir
    local = {k: v for k, v in env.items() if not k.startswith("PG")}
    async with temporary_server(old_bin, old_dir, socket, UPGRADE_PORT_OLD):
        # errors are expected for what initdb made already (the role postgres); the check judges the result
        code, text = await run_tool([str(old_bin / "psql"), "-X", "-q", "-h", str(socket), "-p",
                                     str(UPGRADE_PORT_OLD), "-U", "postgres", "-d", "postgres", "-f", str(dump)],
                                    env=local, echo=False)  # fmt: skip
    dump.unlink(missing_ok=True)
    await initdb(new_bin, new, new_dir, wanted)
    code, text = await run_tool([
        str(new_bin / "pg_upgrade"), "--check",
        "--old-bindir", str(old_bin), "--new-bindir", str(new_bin),
        "--old-datadir", str(old_dir), "--new-datadir", str(new_dir),
        "--username", "postgres", "--socketdir", str(socket),
        "--old-port", str(UPGRADE_PORT_OLD), "--new-port", str(UPGRADE_PORT_NEW),
    ], cwd=work, env=local)  # fmt: skip
    if code != 0:
        lines = [line.rstrip() for line in text.splitlines() if line.strip()]
        failing = [line for line in lines if "fatal" in line or "failed" in line.lower()]
        explanation = "\n".join(lines[-12:])
        listed = _reports(work) or _reports(new_dir)
        raise UpgradeError(f"pg_upgrade --check {old} -> {new} failed: " + "; ".join(failing[:5]) + "\n"
                           + explanation + ("\n" + listed if listed else ""))  # fmt: skip
    return f"pg_upgrade --check {old} -> {new} passed ({wanted.describe()})"


def main(env: dict[str, str] | None = None) -> int:
    """``kanri-instance upgrade-check``; 0 when the check passed."""
    if (pod := upgrade_pod(env)) is None:
        return 2
    settings, old, new, environ, termination = pod.settings, pod.old, pod.new, pod.environ, pod.termination
    started = time.monotonic()
    try:
        summary = asyncio.run(check(settings, old, new, environ, settings.pgdata.parent / "check"))
    except (UpgradeError, OSError) as exc:
        log.error("upgrade check failed", error=str(exc)[:500])
        verdict("Failed", str(exc), termination, durationSeconds=round(time.monotonic() - started, 1))
        return 1
    log.info("upgrade check passed", summary=summary)
    verdict("Succeeded", summary, termination, durationSeconds=round(time.monotonic() - started, 1))
    return 0
