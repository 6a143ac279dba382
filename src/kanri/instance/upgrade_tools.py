"""What the major-upgrade pods share: both majors' programs, a throwaway server, initdb matching a data directory.

The upgrade image (``kanri.dev/postgres-upgrade:<to>``) holds the target major's programs (``KANRI_PG_BIN``) and every
older major it can upgrade from (``KANRI_PG_BIN_<major>``): pg_upgrade needs both sides' binaries in one container
and each upgrade must use the new side's own pg_upgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kanri.instance.config import Settings, SettingsError
from kanri.instance.logs import configure_logging

__all__ = [
    "TERMINATION_LOG",
    "InitdbSettings",
    "UpgradeError",
    "UpgradePod",
    "bin_dir",
    "checksums_enabled",
    "controldata",
    "initdb",
    "run_tool",
    "temporary_server",
    "upgrade_pod",
    "verdict",
]

TERMINATION_LOG = Path("/dev/termination-log")
"""Where the kubelet takes a pod's termination message from (``KANRI_TERMINATION_LOG`` overrides it)."""

UPGRADE_PORT_OLD = 50432
UPGRADE_PORT_NEW = 50433


class UpgradeError(RuntimeError):
    """A step of the check or of the upgrade failed; the message is for status.upgrade.message."""


def bin_dir(major: int, env: Mapping[str, str] | None = None) -> Path:
    """The directory of ``major``'s programs in this image."""
    env = os.environ if env is None else env
    raw = env.get(f"KANRI_PG_BIN_{major}", "").strip()
    if not raw:
        raise UpgradeError(f"this image has no PostgreSQL {major} (KANRI_PG_BIN_{major} is not set)")
    path = Path(raw)
    if not (path / "postgres").is_file():
        raise UpgradeError(f"KANRI_PG_BIN_{major}={raw} holds no postgres program")
    return path


async def run_tool(args: list[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
                   echo: bool = True) -> tuple[int, str]:  # fmt: skip
    """Run one program; its whole output comes back (and goes to our stderr, the pod's log)."""
    proc = await asyncio.create_subprocess_exec(
        *args,
        cwd=str(cwd) if cwd is not None else None,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=dict(env) if env is not None else None,
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    if echo:
        sys.stderr.write(text)
        sys.stderr.flush()
    return proc.returncode or 0, text


async def controldata(bindir: Path, pgdata: Path) -> dict[str, str]:
    """``pg_controldata`` as a mapping (``Database cluster state`` → ``shut down``)."""
    code, text = await run_tool([str(bindir / "pg_controldata"), "-D", str(pgdata)], echo=False)
    if code != 0:
        raise UpgradeError(f"pg_controldata failed on {pgdata}: {text.strip()[-500:]}")
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def checksums_enabled(fields: Mapping[str, str]) -> bool:
    return fields.get("Data page checksum version", "0") not in ("0", "")


@dataclass(frozen=True)
class InitdbSettings:
    """What the new cluster must share with the old one for pg_upgrade to accept it."""

    encoding: str
    collate: str
    ctype: str
    checksums: bool

    def describe(self) -> str:
        return (f"encoding {self.encoding}, LC_COLLATE {self.collate}, LC_CTYPE {self.ctype}, "
                f"checksums {'on' if self.checksums else 'off'}")  # fmt: skip


async def initdb(bindir: Path, major: int, target: Path, settings: InitdbSettings) -> None:
    """A new, empty cluster of ``major`` at ``target`` with ``settings`` (peer for the local superuser, as ours)."""
    args = [
        str(bindir / "initdb"),
        "--pgdata",
        str(target),
        "--auth-local=peer",
        "--auth-host=scram-sha-256",
        f"--encoding={settings.encoding}",
        f"--lc-collate={settings.collate}",
        f"--lc-ctype={settings.ctype}",
        "--username=postgres",
    ]
    if settings.checksums:
        args.append("--data-checksums")
    elif major >= 18:
        args.append("--no-data-checksums")  # 18 turns them on by default; the old cluster has none
    code, text = await run_tool(args)
    if code != 0:
        raise UpgradeError(f"initdb of PostgreSQL {major} failed with code {code}: {text.strip()[-800:]}")


@asynccontextmanager
async def temporary_server(bindir: Path, pgdata: Path, socket_dir: Path, port: int,
                           options: str = "") -> AsyncIterator[None]:  # fmt: skip
    """A server on ``pgdata`` reachable only on its unix socket in ``socket_dir``, stopped (fast, clean) at the end."""
    pg_ctl = str(bindir / "pg_ctl")
    opts = f"-c listen_addresses='' -c unix_socket_directories='{socket_dir}' -c port={port} " + options
    code, text = await run_tool([pg_ctl, "start", "-w", "-t", "300", "-D", str(pgdata), "-o", opts,
                                 "-l", str(socket_dir / f"server-{port}.log")])  # fmt: skip
    if code != 0:
        log = socket_dir / f"server-{port}.log"
        tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
        raise UpgradeError(f"could not start PostgreSQL on {pgdata}: {text.strip()[-400:]} {tail}".strip())
    try:
        yield
    finally:
        await run_tool([pg_ctl, "stop", "-w", "-t", "300", "-m", "fast", "-D", str(pgdata)])


def verdict(result: str, message: str, termination_log: Path, **extra: Any) -> str:
    """The one-line JSON verdict the operator reads from the pod's termination message (also printed)."""
    line = json.dumps({"result": result, "message": message[-3500:], **extra}, sort_keys=True)
    with contextlib.suppress(OSError):  # outside a pod: stdout is enough
        termination_log.write_text(line + "\n")
    print(line, flush=True)
    return line


@dataclass(frozen=True)
class UpgradePod:
    """What a major upgrade's one-off pod (``upgrade-check`` or ``upgrade``) starts from."""

    settings: Settings
    old: int
    new: int
    environ: dict[str, str]
    termination: Path


def upgrade_pod(env: Mapping[str, str] | None = None) -> UpgradePod | None:
    """The pod's settings and both majors (``KANRI_UPGRADE_FROM``/``KANRI_UPGRADE_TO``) from the environment, with
    logging configured; None once a Failed verdict says which setting is wrong (the pod then exits 2)."""
    environ = dict(os.environ if env is None else env)
    termination = Path(environ.get("KANRI_TERMINATION_LOG") or TERMINATION_LOG)
    try:
        settings = Settings.from_env(environ)
        old, new = int(environ["KANRI_UPGRADE_FROM"]), int(environ["KANRI_UPGRADE_TO"])
    except (SettingsError, KeyError, ValueError) as exc:
        configure_logging()
        verdict("Failed", f"invalid settings: {exc}", termination)
        return None
    configure_logging(instance=settings.name, cluster=settings.cluster, namespace=settings.namespace)
    return UpgradePod(settings, old, new, environ, termination)
