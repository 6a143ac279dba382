"""A former primary follows the new one: ``pg_rewind`` from it, or a fresh clone when rewinding is impossible.

pg_rewind connects to the new primary (``KANRI_PRIMARY_HOST``) as the superuser over TCP: it reads files through
``pg_read_binary_file`` and friends, which need a superuser, and pg_hba allows ``postgres`` there with SCRAM (the
``host all all all scram-sha-256`` line). The password travels in a passfile in the private socket directory, named
by ``PGPASSFILE`` and removed afterwards; never in argv. Before it runs, the source gets a ``CHECKPOINT``: right
after a promotion, PostgreSQL 15's control file still shows the old timeline until the end-of-recovery checkpoint,
and pg_rewind would then answer "no rewind required" for a server that has diverged. The clone fallback moves the old
data directory aside (``<PGDATA>.kanri-old``) and removes it only once the clone is in place; a manager killed in
between puts the old one back at its next start (:func:`restore_interrupted`), still fenced.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psycopg
import structlog
from psycopg.conninfo import make_conninfo

from kanri.contract.status import Divergence as ContractDivergence
from kanri.contract.status import Rejoin
from kanri.instance.bootstrap import has_data
from kanri.instance.conf import render_passfile, write_if_changed
from kanri.instance.config import SUPERUSER, Credentials, Settings
from kanri.instance.demote import read_controldata
from kanri.instance.divergence import Divergence, measure
from kanri.instance.tls import client_options

log = structlog.get_logger("kanri.instance.rejoin")

State = Literal["running", "done", "failed"]
Method = Literal["rewind", "clone"]


@dataclass
class RejoinStatus:
    """``/status``'s ``rejoin``: the state of the last ``POST /rejoin`` and a message for the operator's Event."""

    state: State
    method: Method
    message: str
    divergence: Divergence | None = None

    def report(self) -> Rejoin:
        """The contract's form, for ``/status`` (``divergence`` only once measured)."""
        if self.divergence is None:
            return Rejoin(state=self.state, method=self.method, message=self.message)
        divergence = ContractDivergence.model_validate(self.divergence.as_json())
        return Rejoin(state=self.state, method=self.method, message=self.message, divergence=divergence)


@dataclass(frozen=True)
class RewindResult:
    """``ok``: the data directory now follows the source. ``message`` says what happened, in one line.
    ``divergence``: what this instance had written past the source's switchpoint, measured before anything was
    discarded (None when it could not be measured)."""

    ok: bool
    message: str
    divergence: Divergence | None = None


def source_label(settings: Settings) -> str:
    """How the messages name the new primary."""
    return f"{settings.primary_host}:{settings.primary_port}"


def aside_path(settings: Settings) -> Path:
    """Where the old data directory waits while a clone replaces it."""
    return settings.pgdata.with_name(settings.pgdata.name + ".kanri-old")


def rewind_passfile(settings: Settings) -> Path:
    """The superuser's passfile for pg_rewind: in the private socket directory, only while pg_rewind runs."""
    return settings.socket_dir / "kanri-rewind.pgpass"


async def _run(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=env,
    )  # fmt: skip
    try:
        out, _ = await proc.communicate()
    except asyncio.CancelledError:
        proc.terminate()
        await proc.wait()
        raise
    text = out.decode(errors="replace")
    sys.stderr.write(text)  # the tool's own account goes to the container log
    sys.stderr.flush()
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return proc.returncode or 0, " / ".join(lines[-2:])[:300]


async def _prepare_source(settings: Settings, superuser: Credentials) -> tuple[str, int, str]:
    """CHECKPOINT on the source (see the module docstring); its system identifier, its timeline and that timeline's
    history file ("" for timeline 1)."""
    async with await psycopg.AsyncConnection.connect(
        host=settings.primary_host,
        port=settings.primary_port,
        user=SUPERUSER,
        password=superuser.password,  # to libpq in memory, never in argv or a log
        dbname="postgres",
        application_name=f"{settings.name}-rewind",
        connect_timeout=10,
        autocommit=True,
        **dict[str, Any](client_options(settings)),
    ) as conn:
        cursor = await conn.execute("SELECT pg_is_in_recovery()")
        row = await cursor.fetchone()
        if row is None or row[0]:
            raise RuntimeError(f"{source_label(settings)} is not a primary")
        await conn.execute("CHECKPOINT")
        cursor = await conn.execute(
            "SELECT (SELECT system_identifier::text FROM pg_control_system()),"
            " (SELECT timeline_id FROM pg_control_checkpoint())"
        )
        row = await cursor.fetchone()
        assert row is not None
        timeline = int(row[1])
        history = ""
        if timeline > 1:  # the superuser may read files of the data directory
            cursor = await conn.execute("SELECT pg_read_file(%s)", (f"pg_wal/{timeline:08X}.history",))
            found = await cursor.fetchone()
            history = str(found[0]) if found is not None else ""
        return str(row[0]), timeline, history


async def rewind(settings: Settings, superuser: Credentials | None) -> RewindResult:
    """Run pg_rewind of the stopped PGDATA from ``KANRI_PRIMARY_HOST``; never raises for what the caller can fall
    back from (a clone)."""
    source = source_label(settings)
    if superuser is None:
        return RewindResult(False, "pg_rewind impossible: no usable superuser Secret")
    try:
        local = await read_controldata(settings.binary("pg_controldata"), settings.pgdata)
        system, timeline, history = await _prepare_source(settings, superuser)
    except (psycopg.Error, OSError, RuntimeError, ValueError) as exc:
        return RewindResult(False, f"pg_rewind impossible: {str(exc).strip().splitlines()[0][:200]}")
    if system != local.system_identifier:
        return RewindResult(
            False, f"pg_rewind impossible: {source} is another system ({system}, this one {local.system_identifier})"
        )
    divergence = await _diverged(settings, local.timeline, timeline, history)
    passfile = rewind_passfile(settings)
    settings.socket_dir.mkdir(parents=True, exist_ok=True)
    write_if_changed(passfile, render_passfile(Credentials(SUPERUSER, superuser.password)))
    conninfo = make_conninfo(
        host=settings.primary_host,
        port=settings.primary_port,
        user=SUPERUSER,
        dbname="postgres",
        passfile=str(passfile),
        application_name=f"{settings.name}-rewind",
        connect_timeout=10,
        **client_options(settings),
    )
    args = [settings.binary("pg_rewind"), f"--target-pgdata={settings.pgdata}", f"--source-server={conninfo}"]
    env = {**os.environ, "PGPASSFILE": str(passfile), "LC_ALL": "C"}
    log.info("pg_rewind", source=source, source_timeline=timeline)
    started = time.monotonic()
    try:
        code, tail = await _run(args, env)
    finally:
        passfile.unlink(missing_ok=True)
    took = time.monotonic() - started
    if code != 0:
        return RewindResult(False, f"pg_rewind from {source} failed: {tail or f'exit code {code}'}", divergence)
    what = "no rewind was needed" if "no rewind required" in tail else f"to timeline {timeline}"
    return RewindResult(True, f"pg_rewind from {source} ({what}) in {took:.1f} s", divergence)


async def _diverged(settings: Settings, own: int, source: int, history: str) -> Divergence | None:
    """What this stopped instance wrote on its timeline ``own`` past where the source's timeline left it."""
    if source <= own:
        return None
    try:
        found = await measure(settings.binary("pg_waldump"), settings.pgdata / "pg_wal", own, history)
    except OSError as exc:
        log.warning("divergence not measured", error=str(exc)[:200])
        return None
    if found is not None:
        log.info("divergence measured", **found.as_json())
    return found


def move_aside(settings: Settings) -> Path:
    """Move PGDATA out of the way of a clone (an older leftover is removed first)."""
    aside = aside_path(settings)
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(settings.pgdata, aside)
    return aside


def restore_interrupted(settings: Settings) -> str | None:
    """At start: what a clone interrupted by a crash left. The old copy goes back when no complete clone replaced it
    (the fence, lifted only at the end of a rejoin, still keeps it stopped); otherwise it is removed. Returns what
    was done, for the log."""
    aside = aside_path(settings)
    if not aside.exists():
        return None
    if has_data(settings.pgdata):
        shutil.rmtree(aside, ignore_errors=True)
        return "removed the old data directory a completed rejoin left"
    if settings.pgdata.exists():
        shutil.rmtree(settings.pgdata)
    os.replace(aside, settings.pgdata)
    return "put the old data directory back after an interrupted rejoin"
