"""The instance manager against real PostgreSQL 15: bootstrap, replication, config, actions, shutdown, secrecy.

Each instance is a real ``python -m kanri.instance`` process running as the ``postgres`` OS user (PostgreSQL refuses
root), on 127.0.0.1 with its own ports, socket directory and data volume under one temporary directory. One primary
and one replica are shared by the whole module; the promotion test clones a third instance of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
import psycopg
import pytest
import pytest_asyncio

import kanri
from kanri.local.ports import free_port
from tests.support import eventually

PG_BIN = Path(os.environ.get("KANRI_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
CLUSTER = "orders"

pytestmark = [
    pytest.mark.skipif(not (PG_BIN / "postgres").exists(), reason=f"no PostgreSQL binaries in {PG_BIN}"),
    pytest.mark.timeout(180),
]


def run_as() -> pwd.struct_passwd | None:
    """The OS user instances run as: ``postgres`` when the tests run as root (PostgreSQL refuses root)."""
    return pwd.getpwnam("postgres") if os.geteuid() == 0 else None


def python_for_instances() -> tuple[str, dict[str, str]]:
    """An interpreter the instance user can execute, and the PYTHONPATH that finds kanri and its dependencies.

    The venv's interpreter may live under a private home (e.g. /root/.pyenv); the system Python of the same version
    can then run the same site-packages."""
    src = str(Path(kanri.__file__).resolve().parents[1])
    site_packages = str(Path(psycopg.__file__).resolve().parents[1])
    env = {"PYTHONPATH": f"{src}:{site_packages}"}
    candidate = Path(sys.executable).resolve()
    if run_as() is None or all(os.stat(p).st_mode & 0o001 for p in [candidate, *candidate.parents]):
        return sys.executable, env
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        pytest.skip("no Python the postgres user can run")
    return str(system), env


@dataclass
class Workspace:
    """The pod-independent pieces: Secrets, the API token, the ConfigMap (shared by every instance)."""

    root: Path
    passwords: dict[str, str] = field(default_factory=dict)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    generation: int = 0

    def secret_dir(self, name: str) -> Path:
        return self.root / "secrets" / name

    def write_secrets(self) -> None:
        for name, user in (("superuser", "postgres"), ("replication", "streaming_replica"), ("app", "orders_owner")):
            directory = self.secret_dir(name)
            directory.mkdir(parents=True)
            self.passwords[name] = f"pw-{name}-{secrets.token_hex(8)}"
            (directory / "username").write_text(user)
            (directory / "password").write_text(self.passwords[name])
        (self.root / "secrets" / "token").write_text(self.token + "\n")

    def write_backup_keys(self, access_key_id: str, secret_access_key: str) -> Path:
        """The repository's key pair as the mounted backup Secret's files (``KANRI_BACKUP_CREDENTIALS_DIR``)."""
        from kanri.instance.archive import ACCESS_KEY_FILE, SECRET_KEY_FILE

        backup = self.root / "secrets" / "backup"
        backup.mkdir()
        (backup / ACCESS_KEY_FILE).write_text(access_key_id)
        (backup / SECRET_KEY_FILE).write_text(secret_access_key)
        return backup

    def write_config(
        self,
        parameters: dict[str, Any],
        instances: list[str],
        synchronous_standbys: int = 0,
        system_identifier: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Like the kubelet updates a ConfigMap volume: a new timestamped dir, then the ``..data`` symlink swapped."""
        config = self.root / "config"
        config.mkdir(exist_ok=True)
        self.generation += 1
        version = config / f"..v{self.generation}"
        version.mkdir()
        body: dict[str, Any] = {
            "parameters": parameters,
            "instances": instances,
            "synchronousStandbys": synchronous_standbys,
        }
        if system_identifier is not None:
            body["systemIdentifier"] = system_identifier
        body.update(extra or {})
        (version / "instance.json").write_text(json.dumps(body))
        tmp = config / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, config / "..data")
        link = config / "instance.json"
        if not link.is_symlink():
            link.symlink_to("..data/instance.json")
        chown_tree(config)


def chown_tree(root: Path, *, recursive: bool = True) -> None:
    """Hand ``root`` (and what is below it) to the instance user."""
    user = run_as()
    if user is None:
        return
    for path in [root, *(root.rglob("*") if recursive else ())]:
        os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)


@dataclass
class Instance:
    """One instance manager process and its pod-local directories."""

    workspace: Workspace
    name: str
    bootstrap: str
    pg_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None
    readiness_seen: list[int] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.workspace.root / self.name

    @property
    def pgdata(self) -> Path:
        return self.root / "volume" / "pgdata"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def env(self, primary_port: int | None) -> dict[str, str]:
        secrets_dir = self.workspace.root / "secrets"
        python_env = python_for_instances()[1]
        return {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            **python_env,
            "KANRI_CLUSTER": CLUSTER,
            "POD_NAME": self.name,
            "POD_NAMESPACE": "test",
            "POD_IP": "127.0.0.1",
            "PGDATA": str(self.pgdata),
            "KANRI_PG_BIN": str(PG_BIN),
            "KANRI_BOOTSTRAP": self.bootstrap,
            "KANRI_PRIMARY_HOST": "127.0.0.1",
            "KANRI_PRIMARY_PORT": str(primary_port or 5432),
            "KANRI_SUPERUSER_DIR": str(secrets_dir / "superuser"),
            "KANRI_REPLICATION_DIR": str(secrets_dir / "replication"),
            "KANRI_APP_DIR": str(secrets_dir / "app"),
            "KANRI_APP_DATABASE": "orders",
            "KANRI_API_TOKEN_FILE": str(secrets_dir / "token"),
            "KANRI_CONFIG_FILE": str(self.workspace.root / "config" / "instance.json"),
            "KANRI_PG_PORT": str(self.pg_port),
            "KANRI_HTTP_PORT": str(self.http_port),
            "KANRI_LISTEN_ADDRESS": "127.0.0.1",
            "KANRI_SOCKET_DIR": str(self.root / "run"),
            **self.extra_env,
        }

    async def start(self, primary_port: int | None = None) -> None:
        """Start the manager (as ``postgres`` when root); output goes to out.log / err.log (appended)."""
        for sub in ("volume", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for path in (self.root, self.root / "volume", self.root / "run"):
            chown_tree(path, recursive=False)
        python, _ = python_for_instances()
        user = run_as()
        ids: dict[str, Any] = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        out, err = self._open_logs()
        with out, err:
            self.process = await asyncio.create_subprocess_exec(
                python,
                "-m",
                "kanri.instance",
                env=self.env(primary_port),
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                **ids,
            )

    def _open_logs(self) -> tuple[BinaryIO, BinaryIO]:
        return open(self.root / "out.log", "ab"), open(self.root / "err.log", "ab")  # closed by start()

    async def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit code."""
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(timeout):
            return await self.process.wait()

    def output(self) -> str:
        return (self.root / "out.log").read_text() + (self.root / "err.log").read_text()

    def log_events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.root / "out.log").read_text().splitlines() if line.strip()]

    async def get(self, path: str) -> tuple[int, dict[str, Any]]:
        """GET with the API token, as the operator asks (only /healthz and /readyz would answer without it)."""
        headers = {"Authorization": f"Bearer {self.workspace.token}"}
        async with aiohttp.ClientSession() as http, http.get(self.url + path, headers=headers) as response:
            return response.status, await response.json()

    async def post(self, path: str, token: str | None) -> tuple[int, dict[str, Any]]:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as http, http.post(self.url + path, headers=headers) as response:
            return response.status, await response.json()

    async def post_json(self, path: str, token: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as http, http.post(self.url + path, headers=headers, json=body) as response:
            return response.status, await response.json()

    async def alive(self) -> bool:
        """/healthz answers 200."""
        try:
            return (await self.get("/healthz"))[0] == 200
        except aiohttp.ClientConnectionError:
            return False

    async def status(self) -> dict[str, Any]:
        code, body = await self.get("/status")
        assert code == 200
        return body

    async def wait_ready(self, timeout: float = 90) -> None:
        """Poll /readyz until 200, recording every answer (connection refused = 0)."""

        async def ready() -> bool:
            assert self.process is not None
            assert self.process.returncode is None, f"{self.name} exited:\n{self.output()[-3000:]}"
            try:
                code, _ = await self.get("/readyz")
            except aiohttp.ClientConnectionError:
                code = 0
            self.readiness_seen.append(code)
            return code == 200

        try:
            await eventually(ready, timeout=timeout, interval=0.05)
        except TimeoutError:
            raise AssertionError(f"{self.name} not ready after {timeout} s:\n{self.output()[-4000:]}") from None

    async def connect(self, role: str = "superuser", dbname: str = "postgres") -> psycopg.AsyncConnection[Any]:
        """Over TCP with SCRAM, as a test client would."""
        user = (self.workspace.secret_dir(role) / "username").read_text()
        return await psycopg.AsyncConnection.connect(
            host="127.0.0.1",
            port=self.pg_port,
            user=user,
            password=self.workspace.passwords[role],
            dbname=dbname,
            autocommit=True,
        )

    async def query(self, sql: str, role: str = "superuser", dbname: str = "postgres") -> list[tuple[Any, ...]]:
        async with await self.connect(role, dbname) as conn:
            cursor = await conn.execute(sql.encode())
            return await cursor.fetchall() if cursor.description else []

    def controldata_state(self) -> str:
        out = subprocess.run(
            [str(PG_BIN / "pg_controldata"), str(self.pgdata)], capture_output=True, text=True, check=True
        ).stdout
        return next(
            line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Database cluster state")
        )


def postmasters(pgdata: Path) -> list[str]:
    """Pids of PostgreSQL servers on ``pgdata`` — not the manager's short-lived ``postgres -C`` checks, which read
    the same data directory (CI once caught one mid-run)."""
    return [
        pid
        for pid, argv in all_argv().items()
        if argv.startswith(str(PG_BIN / "postgres")) and str(pgdata) in argv and "\0-C\0" not in argv
    ]


def all_argv() -> dict[str, str]:
    """Every process's command line (what ``ps`` shows)."""
    found: dict[str, str] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                found[proc.name] = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
    return found


BASE_PARAMETERS: dict[str, Any] = {"log_statement": "all", "work_mem": "4MB"}
"""log_statement=all proves the manager's own password statements stay out of PostgreSQL's log."""


@pytest.fixture(scope="module")
def workspace() -> Iterator[Workspace]:
    root = Path(tempfile.mkdtemp(prefix="kanri-instance-"))
    ws = Workspace(root)
    ws.write_secrets()
    ws.write_config(BASE_PARAMETERS, [f"{CLUSTER}-1"])
    chown_tree(root)
    try:
        yield ws
    finally:
        if not os.environ.get("KANRI_TEST_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


async def _cleanup(*instances: Instance) -> None:
    for instance in instances:
        process = instance.process
        if process is not None and process.returncode is None:
            try:
                await instance.stop(timeout=30)
            except TimeoutError:
                process.kill()
                await process.wait()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def primary(workspace: Workspace) -> AsyncIterator[Instance]:
    instance = Instance(workspace, f"{CLUSTER}-1", "primary")
    await instance.start()
    try:
        await instance.wait_ready()
        yield instance
    finally:
        await _cleanup(instance)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def replica(workspace: Workspace, primary: Instance) -> AsyncIterator[Instance]:
    # the operator lists an instance before it creates its pod; the primary then makes its slot
    workspace.write_config(BASE_PARAMETERS, [f"{CLUSTER}-1", f"{CLUSTER}-2"])
    instance = Instance(workspace, f"{CLUSTER}-2", "replica")
    await instance.start(primary_port=primary.pg_port)
    try:
        await instance.wait_ready()
        yield instance
    finally:
        await _cleanup(instance)


async def test_readyz_answers_503_with_a_reason_until_postgres_is_ready(primary: Instance) -> None:
    seen = primary.readiness_seen
    assert 503 in seen, seen
    assert seen[-1] == 200
    assert all(code in (0, 503) for code in seen[:-1])
    code, body = await primary.get("/healthz")
    assert code == 200
    code, body = await primary.get("/readyz")
    assert (code, body) == (200, {"ready": True})


async def test_primary_bootstraps_with_checksums_roles_and_the_app_database(primary: Instance) -> None:
    assert await primary.query("SHOW data_checksums") == [("on",)]
    owner = await primary.query(
        "SELECT pg_get_userbyid(datdba), pg_encoding_to_char(encoding) FROM pg_database WHERE datname = 'orders'"
    )
    assert owner == [("orders_owner", "UTF8")]
    assert await primary.query("SELECT rolreplication FROM pg_roles WHERE rolname = 'streaming_replica'") == [(True,)]

    # the application owner logs in over TCP with SCRAM and owns its database
    assert await primary.query("SELECT current_user, current_database()", role="app", dbname="orders") == [
        ("orders_owner", "orders")
    ]
    verifier = await primary.query("SELECT rolpassword FROM pg_authid WHERE rolname = 'orders_owner'")
    assert verifier[0][0].startswith("SCRAM-SHA-256$")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        await psycopg.AsyncConnection.connect(
            host="127.0.0.1", port=primary.pg_port, user="orders_owner", password="wrong", dbname="orders"
        )

    status = await primary.status()
    assert status["name"] == f"{CLUSTER}-1"
    assert status["role"] == "primary"
    assert status["inRecovery"] is False
    assert status["timeline"] == 1
    assert status["running"] is True
    assert status["ready"] is True
    assert status["postgresVersion"].startswith("15.")
    assert status["systemIdentifier"].isdigit()
    assert status["writeLsn"]
    assert status["flushLsn"]
    hba = (primary.pgdata / "pg_hba.conf").read_text()
    assert "trust" not in hba
    assert "md5" not in hba


async def test_a_replica_clones_through_its_slot_and_streams(primary: Instance, replica: Instance) -> None:
    await primary.query("CREATE TABLE IF NOT EXISTS items (id int)", role="app", dbname="orders")
    await primary.query("INSERT INTO items VALUES (42)", role="app", dbname="orders")

    async def replicated() -> bool:
        try:
            rows = await replica.query("SELECT id FROM items", role="app", dbname="orders")
        except psycopg.errors.UndefinedTable:
            return False
        return (42,) in rows

    await eventually(replicated, timeout=30)

    async def caught_up() -> dict[str, Any] | None:
        status = await replica.status()
        return status if status["lagBytes"] == 0 and status["streaming"] else None

    status = await eventually(caught_up, timeout=30)
    assert status["role"] == "replica"
    assert status["inRecovery"] is True
    assert status["receiveLsn"]
    assert status["replayLsn"]
    assert status["timeline"] == 1
    assert status["systemIdentifier"] == (await primary.status())["systemIdentifier"]
    assert "primary_conninfo" in (replica.pgdata / "postgresql.conf").read_text()
    assert (replica.pgdata / "standby.signal").exists()
    assert 503 in replica.readiness_seen  # not ready while cloning

    replicas = (await primary.status())["replicas"]
    assert [(r["name"], r["state"], r["syncState"]) for r in replicas] == [(f"{CLUSTER}-2", "streaming", "async")]
    slots = await primary.query("SELECT slot_name, active FROM pg_replication_slots")
    assert slots == [(f"{CLUSTER}_2", True)]


async def test_a_reloadable_parameter_applies_without_a_restart(
    workspace: Workspace, primary: Instance, replica: Instance
) -> None:
    started = await primary.query("SELECT pg_postmaster_start_time()")
    workspace.write_config({**BASE_PARAMETERS, "work_mem": "12MB"}, [f"{CLUSTER}-1", f"{CLUSTER}-2"])

    async def applied() -> bool:
        return await primary.query("SHOW work_mem") == [("12MB",)]

    await eventually(applied, timeout=15)
    assert await primary.query("SELECT pg_postmaster_start_time()") == started
    assert (await primary.status())["pendingRestart"] is False
    assert any(e["event"] == "configuration reloaded" for e in primary.log_events())


async def test_a_restart_parameter_is_pending_until_post_restart(
    workspace: Workspace, primary: Instance, replica: Instance
) -> None:
    workspace.write_config(
        {**BASE_PARAMETERS, "work_mem": "12MB", "shared_buffers": "64MB"}, [f"{CLUSTER}-1", f"{CLUSTER}-2"]
    )

    async def pending(instance: Instance) -> bool:
        return bool((await instance.status())["pendingRestart"])

    await eventually(lambda: pending(primary), timeout=15)
    await eventually(lambda: pending(replica), timeout=15)
    assert await primary.query("SHOW shared_buffers") == [("128MB",)]

    assert (await replica.post("/restart", None))[0] == 401
    for instance in (replica, primary):  # replicas first, as the operator orders it
        code, body = await instance.post("/restart", workspace.token)
        assert (code, body) == (200, {"restarted": True, "pendingRestart": False})
        assert await instance.query("SHOW shared_buffers") == [("64MB",)]
    await replica.wait_ready()
    assert (await replica.status())["restartCount"] == 0  # an ordered restart is not a crash


async def test_synchronous_standbys_turn_the_replica_into_a_quorum_member(
    workspace: Workspace, primary: Instance, replica: Instance
) -> None:
    instances = [f"{CLUSTER}-1", f"{CLUSTER}-2"]

    async def sync_state(expected: str) -> bool:
        replicas = (await primary.status())["replicas"]
        return [r["syncState"] for r in replicas] == [expected]

    workspace.write_config(BASE_PARAMETERS, instances, synchronous_standbys=1)
    try:
        await eventually(lambda: sync_state("quorum"), timeout=15)
        assert await primary.query("SHOW synchronous_standby_names") == [('ANY 1 ("orders-2")',)]
        await primary.query("INSERT INTO items VALUES (7)", role="app", dbname="orders")  # acknowledged by the quorum
    finally:
        workspace.write_config(BASE_PARAMETERS, instances)
    await eventually(lambda: sync_state("async"), timeout=15)


async def test_promote_needs_the_token_and_is_refused_on_a_primary(
    workspace: Workspace, primary: Instance, replica: Instance
) -> None:
    assert (await replica.post("/promote", None))[0] == 401
    assert (await replica.post("/promote", "not-the-token"))[0] == 401
    code, body = await primary.post("/promote", workspace.token)
    assert code == 409
    assert "already a primary" in body["error"]
    assert (await replica.status())["role"] == "replica"


async def test_sigterm_shuts_down_cleanly_and_a_restart_reuses_the_data(primary: Instance, replica: Instance) -> None:
    identifier = (await primary.status())["systemIdentifier"]

    assert await replica.stop() == 0
    assert replica.controldata_state() == "shut down in recovery"
    assert await primary.stop() == 0
    assert primary.controldata_state() == "shut down"
    # as after a container restart: the file is left behind and its PID now names an unrelated live process
    (primary.pgdata / "postmaster.pid").write_text(f"{os.getpid()}\n{primary.pgdata}\n")

    await primary.start()
    await primary.wait_ready()
    assert any(e["event"] == "removed a stale postmaster.pid" for e in primary.log_events())
    await replica.start(primary_port=primary.pg_port)
    await replica.wait_ready()
    assert (await primary.status())["systemIdentifier"] == identifier
    assert (await replica.status())["role"] == "replica"
    assert (42,) in await replica.query("SELECT id FROM items", role="app", dbname="orders")
    starts = [e for e in primary.log_events() if e["event"] == "initdb"]
    assert len(starts) == 1  # bootstrapped once, started twice


async def test_promotion_moves_to_a_new_timeline_and_a_delisted_slot_is_dropped(
    workspace: Workspace, primary: Instance
) -> None:
    instances = [f"{CLUSTER}-1", f"{CLUSTER}-2", f"{CLUSTER}-3"]
    third = Instance(workspace, f"{CLUSTER}-3", "replica")
    # started before it is listed: the clone waits for the primary's slot
    await third.start(primary_port=primary.pg_port)
    try:
        await eventually(third.alive, timeout=30)
        await asyncio.sleep(1.5)
        workspace.write_config(BASE_PARAMETERS, instances)
        await third.wait_ready()
        assert any(e["event"] == "pg_basebackup failed; retrying" for e in third.log_events())

        before = await third.status()
        code, body = await third.post("/promote", workspace.token)
        assert code == 200, body
        assert body["promoted"] is True
        assert body["timeline"] == before["timeline"] + 1
        status = await third.status()
        assert (status["role"], status["inRecovery"], status["timeline"]) == ("primary", False, body["timeline"])
        assert not (third.pgdata / "standby.signal").exists()
        await third.query("CREATE TABLE promoted (id int)", role="app", dbname="orders")  # writable at once

        async def primary_files() -> bool:  # the config loop's next pass writes a primary's files
            return "primary_conninfo" not in (third.pgdata / "postgresql.conf").read_text()

        await eventually(primary_files, timeout=15)
        # the new primary keeps slots for the others, as any primary does
        await eventually(lambda: third.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'orders_1'"))

        assert await third.stop() == 0
        assert third.controldata_state() == "shut down"
    finally:
        await _cleanup(third)

    workspace.write_config(BASE_PARAMETERS, instances[:2])

    async def slot_gone() -> bool:
        return not await primary.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'orders_3'")

    await eventually(slot_gone, timeout=15)
    assert await primary.query("SELECT slot_name FROM pg_replication_slots") == [(f"{CLUSTER}_2",)]


async def test_a_crashed_postgres_is_restarted_and_reported(primary: Instance, replica: Instance) -> None:
    before = await primary.status()
    postmaster = int((primary.pgdata / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGKILL)

    async def recovered() -> dict[str, Any] | None:
        status = await primary.status()
        return status if status["ready"] and status["restartCount"] == before["restartCount"] + 1 else None

    await eventually(recovered, timeout=60)
    assert any(e["event"] == "postgres exited unexpectedly" for e in primary.log_events())
    # lastError names what still holds: the crash is history (restartCount) once PostgreSQL is back
    await eventually(lambda: _no_last_error(primary), timeout=15)
    await replica.wait_ready()


async def test_a_postgres_its_manager_cannot_reach_is_reported_with_libpqs_first_line_and_cleared(
    workspace: Workspace, primary: Instance
) -> None:
    # The socket directory closed to the manager (uid postgres) while PostgreSQL runs: every connection of its own
    # fails with "Permission denied", as with a socket directory of the wrong owner in a pod. TCP still works.
    run = primary.root / "run"
    mode = run.stat().st_mode & 0o7777
    run.chmod(0)
    try:

        async def reported() -> dict[str, Any] | None:
            status = await primary.status()
            found = [p for p in status["problems"] if p["reason"] == "PostgresUnreachable"]
            return found[0] if found else None

        problem = await eventually(reported, timeout=60, interval=0.5)
        socket_path = run / f".s.PGSQL.{primary.pg_port}"
        assert problem == {
            "reason": "PostgresUnreachable",
            "message": f'connection to server on socket "{socket_path}" failed: Permission denied',
        }
        for secret in workspace.passwords.values():
            assert secret not in problem["message"]
        code, body = await primary.get("/readyz")
        assert (code, body) == (503, {"ready": False, "reason": f"postgres unreachable: {problem['message']}"})
        assert (await primary.status())["running"] is True
    finally:
        run.chmod(mode)

    async def cleared() -> bool:
        status = await primary.status()
        return status["ready"] and not any(p["reason"] == "PostgresUnreachable" for p in status["problems"])

    await eventually(cleared, timeout=30)
    logged = [e for e in primary.log_events() if e.get("reason") == "PostgresUnreachable"]
    assert [e["event"] for e in logged] == ["problem", "problem resolved"], logged  # once each, not every pass
    await primary.wait_ready()


async def test_a_parameter_postgresql_refuses_is_never_written_and_every_other_change_applies(
    workspace: Workspace, primary: Instance
) -> None:
    instances = [f"{CLUSTER}-1", f"{CLUSTER}-2"]
    hostile = {
        **BASE_PARAMETERS,
        "work_mem": "lots",  # was 4MB: keeps it
        "no_such_parameter": "1",
        "lock_timeout": "-5",  # out of range, never set before: stays unset
        "include_if_exists": "/etc/kanri/superuser/password",
        "shared_preload_libraries": "no_such_lib",
        "maintenance_work_mem": "77MB",  # good: applies
    }
    workspace.write_config(hostile, instances)
    try:

        async def applied() -> bool:
            return await primary.query("SHOW maintenance_work_mem") == [("77MB",)]

        await eventually(applied, timeout=15)
        status = await primary.status()
        by_parameter = {p["parameter"]: p for p in status["problems"] if p["reason"] == "InvalidParameter"}
        assert sorted(by_parameter) == [
            "include_if_exists",
            "lock_timeout",
            "no_such_parameter",
            "shared_preload_libraries",
            "work_mem",
        ]
        assert 'invalid value for parameter "work_mem"' in by_parameter["work_mem"]["message"]
        assert "keeps its last good value" in by_parameter["work_mem"]["message"]
        assert "outside the valid range" in by_parameter["lock_timeout"]["message"]
        assert "unrecognized" in by_parameter["no_such_parameter"]["message"]
        for problem in status["problems"]:
            assert len(problem["message"]) <= 300
            for value in ("lots", "-5", "/etc/kanri", "no_such_lib"):
                assert value not in problem["message"]
        assert status["configErrors"] == []  # nothing PostgreSQL cannot use reached its file
        conf = (primary.pgdata / "postgresql.conf").read_text()
        assert "work_mem = '4MB'" in conf
        for absent in ("'lots'", "no_such_parameter", "lock_timeout", "include_if_exists", "no_such_lib"):
            assert absent not in conf
        assert await primary.query("SHOW work_mem") == [("4MB",)]
        # each problem is logged once, not on every pass
        await asyncio.sleep(2 * 2.5)
        logged = [e for e in primary.log_events() if e["event"] == "problem" and e.get("parameter") == "work_mem"]
        assert len(logged) == 1, logged
        # a restart into this configuration works: nothing refused was written
        code, body = await primary.post("/restart", workspace.token)
        assert code == 200, body
    finally:
        workspace.write_config(BASE_PARAMETERS, instances)
    await eventually(lambda: _no_config_errors(primary), timeout=15)
    assert (await primary.status())["problems"] == []


async def test_post_restart_refuses_a_configuration_that_would_not_load(
    workspace: Workspace, primary: Instance
) -> None:
    # ALTER SYSTEM accepts a library that does not exist; a restart into it would never come back on a lone primary
    await primary.query("ALTER SYSTEM SET shared_preload_libraries = 'no_such_lib'")
    try:
        started = await primary.query("SELECT pg_postmaster_start_time()")
        code, body = await primary.post("/restart", workspace.token)
        assert code == 409, body
        assert "shared_preload_libraries" in body["error"]
        assert await primary.query("SELECT pg_postmaster_start_time()") == started
    finally:
        await primary.query("ALTER SYSTEM RESET shared_preload_libraries")
    code, body = await primary.post("/restart", workspace.token)
    assert code == 200, body


async def _no_config_errors(instance: Instance) -> bool:
    status = await instance.status()
    return not status["configErrors"] and status["lastError"] is None and not status["problems"]


async def _no_last_error(instance: Instance) -> bool:
    return (await instance.status())["lastError"] is None


async def test_fence_stops_postgres_keeps_it_stopped_across_a_manager_restart_and_unfence_starts_it(
    workspace: Workspace, primary: Instance, replica: Instance
) -> None:
    marker = replica.pgdata.parent / "kanri-fenced"
    # A row of its own (the test runs alone too), written before the fence: the replica must stream it after unfence.
    await primary.query("CREATE TABLE IF NOT EXISTS items (id int)", role="app", dbname="orders")
    await primary.query("INSERT INTO items VALUES (4242)", role="app", dbname="orders")
    assert (await replica.post("/fence", None))[0] == 401
    assert (await replica.post("/fence", "not-the-token"))[0] == 401
    assert not marker.exists()

    code, body = await replica.post_json("/fence", workspace.token, {"reason": "split brain: orders-1 is kept"})
    assert code == 200, body
    assert (body["fenced"], body["already"], body["stopped"], body["reason"]) == (
        True, False, True, "split brain: orders-1 is kept")  # fmt: skip
    # on the volume, outside PGDATA: a clone (pg_basebackup copies PGDATA) never inherits it
    assert marker.is_file()
    assert not any(path.name.startswith("kanri-fenced") for path in replica.pgdata.rglob("*"))
    with pytest.raises(psycopg.OperationalError):
        await replica.connect()
    await _assert_fenced(replica)
    # idempotent: the first record stays
    again = await replica.post_json("/fence", workspace.token, {"reason": "another reason"})
    assert again == (200, {**body, "already": True, "stopped": False})
    for action in ("/restart", "/promote"):
        code, refused = await replica.post(action, workspace.token)
        assert code == 409, (action, refused)
        assert "fenced" in refused["error"]

    # a restarted manager (a new pod on the same volume) comes back fenced and never starts PostgreSQL
    assert await replica.stop() == 0
    waiting = "postgres kept stopped: the instance is fenced"
    kept_stopped = [e["event"] for e in replica.log_events()].count(waiting)
    await replica.start(primary_port=primary.pg_port)

    async def supervisor_waits() -> bool:
        return [e["event"] for e in replica.log_events()].count(waiting) > kept_stopped

    await eventually(supervisor_waits, timeout=30)
    await _assert_fenced(replica)
    assert not postmasters(replica.pgdata)

    # unfence: the supervisor starts PostgreSQL again, the replica streams and has the rows
    code, body = await replica.post("/unfence", workspace.token)
    assert (code, body) == (200, {"fenced": False, "lifted": True})
    assert not marker.exists()
    await replica.wait_ready()
    status = await replica.status()
    assert (status["fenced"], status["role"], status["running"]) == (False, "replica", True)
    assert not [p for p in status["problems"] if p["reason"] == "Fenced"]

    async def has_row() -> bool:
        try:
            return (4242,) in await replica.query("SELECT id FROM items", role="app", dbname="orders")
        except psycopg.errors.UndefinedTable:  # not replayed yet
            return False

    await eventually(has_row, timeout=30)
    assert (await replica.post("/unfence", workspace.token)) == (200, {"fenced": False, "lifted": False})


async def _assert_fenced(instance: Instance) -> None:
    code, ready = await instance.get("/readyz")
    assert (code, ready["ready"]) == (503, False)
    assert ready["reason"] == "fenced: split brain: orders-1 is kept"
    status = await instance.status()
    assert (status["fenced"], status["running"], status["ready"]) == (True, False, False)
    assert status["fenceReason"] == "split brain: orders-1 is kept"
    fenced = [p for p in status["problems"] if p["reason"] == "Fenced"]
    assert len(fenced) == 1, status["problems"]
    assert "kept stopped until POST /unfence" in fenced[0]["message"]


async def test_a_data_volume_with_foreign_content_is_refused(workspace: Workspace) -> None:
    stray = Instance(workspace, f"{CLUSTER}-9", "primary")
    stray.pgdata.mkdir(parents=True)
    (stray.pgdata / "something").write_text("not a data directory")
    await stray.start()
    try:
        async with asyncio.timeout(30):
            assert stray.process is not None
            assert await stray.process.wait() == 1
    finally:
        await _cleanup(stray)
    errors = [e for e in stray.log_events() if e["level"] == "error"]
    assert "no PG_VERSION" in errors[0]["error"]
    assert (stray.pgdata / "something").exists()


async def test_no_password_in_output_status_conf_or_argv(
    workspace: Workspace, primary: Instance, replica: Instance
) -> None:
    passwords = list(workspace.passwords.values())
    outputs = {i.name: i.output() for i in (primary, replica)}
    third = workspace.root / f"{CLUSTER}-3"
    outputs[third.name] = (third / "out.log").read_text() + (third / "err.log").read_text()
    assert "ALTER ROLE" not in outputs[primary.name]  # log_statement=all is on, the manager's session turns it off
    assert "statement: SELECT" in outputs[primary.name]  # ... while other statements are logged
    for name, text in outputs.items():
        for password in passwords:
            assert password not in text, f"a password in the output of {name}"
    for instance in (primary, replica):
        for path in ("/status", "/readyz"):
            _, body = await instance.get(path)
            assert not any(p in json.dumps(body) for p in passwords)
        conf = (instance.pgdata / "postgresql.conf").read_text() + (
            instance.pgdata / "postgresql.auto.conf"
        ).read_text()
        assert not any(p in conf for p in passwords)
    for pid, argv in all_argv().items():
        assert not any(p in argv for p in passwords), f"a password in the argv of pid {pid}"
