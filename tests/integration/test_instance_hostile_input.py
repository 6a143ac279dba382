"""The instance manager against hostile or careless input, with real PostgreSQL 15 (issue 10).

Each test has a workspace (Secrets, ConfigMap) of its own, because each edits them in ways the shared cluster of
test_instance_manager.py must not see. Instances run as in that module (``python -m kanri.instance`` as
``postgres``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from tests.integration.test_instance_manager import (
    BASE_PARAMETERS,
    CLUSTER,
    PG_BIN,
    Instance,
    Workspace,
    _cleanup,
    chown_tree,
    run_as,
)
from tests.support import eventually

pytestmark = [
    pytest.mark.skipif(not (PG_BIN / "postgres").exists(), reason=f"no PostgreSQL binaries in {PG_BIN}"),
    pytest.mark.timeout(180),
]

FIRST, SECOND = f"{CLUSTER}-1", f"{CLUSTER}-2"


@pytest_asyncio.fixture(loop_scope="session")
async def fresh() -> AsyncIterator[Workspace]:
    root = Path(tempfile.mkdtemp(prefix="kanri-hostile-"))
    ws = Workspace(root)
    ws.write_secrets()
    ws.write_config(BASE_PARAMETERS, [FIRST])
    chown_tree(root)
    try:
        yield ws
    finally:
        if not os.environ.get("KANRI_TEST_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


@pytest_asyncio.fixture(loop_scope="session")
async def instances() -> AsyncIterator[list[Instance]]:
    """Instances a test starts; all stopped at the end."""
    started: list[Instance] = []
    try:
        yield started
    finally:
        await _cleanup(*started)


async def start(instances: list[Instance], instance: Instance, primary_port: int | None = None) -> Instance:
    instances.append(instance)
    await instance.start(primary_port=primary_port)
    return instance


def problems(status: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    return [p for p in status["problems"] if p["reason"] == reason]


async def app_logs_in(instance: Instance) -> bool:
    """The application role logs in over TCP with the password the workspace holds now."""
    try:
        await instance.query("SELECT 1", role="app", dbname="orders")
    except psycopg.OperationalError:
        return False
    return True


def write_secret(ws: Workspace, name: str, key: str, raw: bytes) -> None:
    path = ws.secret_dir(name) / key
    path.write_bytes(raw)
    chown_tree(path, recursive=False)


async def test_binary_junk_in_the_replication_secret_is_reported_once_and_the_manager_keeps_running(
    fresh: Workspace, instances: list[Instance]
) -> None:
    primary = await start(instances, Instance(fresh, FIRST, "primary"))
    await primary.wait_ready()
    write_secret(fresh, "replication", "password", b"\xff\xfe\x00junk")
    await asyncio.sleep(5)  # a few passes: still alive, still ready, no decoding error anywhere
    assert primary.process is not None
    assert primary.process.returncode is None
    assert (await primary.get("/readyz"))[0] == 200
    assert "codec can't decode" not in primary.output()

    async def reported() -> list[dict[str, Any]] | None:
        return problems(await primary.status(), "InvalidSecret") or None

    found = await eventually(reported, timeout=15)
    assert found == [
        {
            "reason": "InvalidSecret",
            "message": "replication Secret: password is not UTF-8 text",
            "secret": "replication",
            "key": "password",
        }
    ]
    logged = [e for e in primary.log_events() if e["event"] == "problem" and e.get("secret") == "replication"]
    assert len(logged) == 1, logged  # logged once, not on every pass

    # the last good password still lets a replica in: pg_hba and the passfile kept it
    assert "streaming_replica" in (primary.pgdata / "pg_hba.conf").read_text()


async def test_an_app_secret_naming_a_reserved_role_never_touches_that_role(
    fresh: Workspace, instances: list[Instance]
) -> None:
    primary = await start(instances, Instance(fresh, FIRST, "primary"))
    await primary.wait_ready()
    write_secret(fresh, "app", "username", b"postgres")
    write_secret(fresh, "app", "password", b"a-new-password")
    await asyncio.sleep(5)  # a few passes
    assert await primary.query("SELECT rolsuper FROM pg_roles WHERE rolname = 'postgres'") == [(True,)]
    # the superuser's password was not replaced by the app Secret's
    assert await primary.query("SELECT current_user") == [("postgres",)]

    async def reported() -> list[dict[str, Any]] | None:
        return [p for p in problems(await primary.status(), "InvalidSecret") if p["secret"] == "app"] or None

    [problem] = await eventually(reported, timeout=15)
    assert problem["key"] == "username"
    assert "reserved" in problem["message"]
    logged = [e for e in primary.log_events() if e["event"] == "problem" and e.get("secret") == "app"]
    assert len(logged) == 1, logged


async def test_a_missing_superuser_password_and_an_empty_app_password_are_reported(
    fresh: Workspace, instances: list[Instance]
) -> None:
    (fresh.secret_dir("superuser") / "password").unlink()
    write_secret(fresh, "app", "password", b"")
    primary = await start(instances, Instance(fresh, FIRST, "primary"))
    await primary.wait_ready()
    status = await primary.status()
    keys = sorted((p["secret"], p["key"], p["message"]) for p in problems(status, "InvalidSecret"))
    assert keys == [
        ("app", "password", "app Secret: password is empty"),
        ("superuser", "password", "superuser Secret: password is missing"),
    ]
    assert status["lastError"] is not None
    assert (status["dataVersion"], status["binaryVersion"]) == (15, 15)


async def test_synchronous_standbys_do_not_deadlock_a_new_cluster(fresh: Workspace, instances: list[Instance]) -> None:
    # a new cluster asked for one synchronous standby before any exists: the manager's own writes must not wait
    fresh.write_config(BASE_PARAMETERS, [FIRST, SECOND], synchronous_standbys=1)
    primary = await start(instances, Instance(fresh, FIRST, "primary"))
    await primary.wait_ready(timeout=60)
    assert await primary.query("SHOW synchronous_standby_names") == [(f'ANY 1 ("{SECOND}")',)]
    owner = await primary.query("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'orders'")
    assert owner == [("orders_owner",)]
    replica = await start(instances, Instance(fresh, SECOND, "replica"), primary_port=primary.pg_port)
    await replica.wait_ready(timeout=60)

    async def quorum() -> bool:
        return [r["syncState"] for r in (await primary.status())["replicas"]] == ["quorum"]

    await eventually(quorum, timeout=15)


async def test_a_blocked_role_statement_neither_shows_its_verifier_nor_holds_up_a_config_change(
    fresh: Workspace, instances: list[Instance]
) -> None:
    primary = await start(instances, Instance(fresh, FIRST, "primary"))
    await primary.wait_ready()
    async with await primary.connect() as holder, await primary.connect() as observer:
        # SHARE conflicts with ALTER ROLE's row lock but not with reads: the manager blocks at its first ALTER ROLE
        await holder.execute("BEGIN")
        await holder.execute("LOCK TABLE pg_catalog.pg_authid IN SHARE MODE")
        fresh.passwords["app"] = "rotated-app-password"
        write_secret(fresh, "app", "password", fresh.passwords["app"].encode())

        async def blocked() -> bool:
            cursor = await observer.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                " WHERE NOT l.granted AND l.relation = 'pg_authid'::regclass AND a.application_name = 'kanri-instance'"
            )
            row = await cursor.fetchone()
            return row is not None and row[0] > 0

        await eventually(blocked, timeout=15)
        cursor = await observer.execute("SELECT coalesce(query, '') FROM pg_stat_activity")
        queries = [row[0] for row in await cursor.fetchall()]
        assert not [q for q in queries if "SCRAM-SHA-256$" in q or "PASSWORD" in q.upper()], queries

        # the config loop is not behind the blocked statement
        fresh.write_config({**BASE_PARAMETERS, "work_mem": "12MB"}, [FIRST])

        async def applied() -> bool:
            cursor = await observer.execute("SHOW work_mem")
            return await cursor.fetchone() == ("12MB",)

        await eventually(applied, timeout=10)
        assert await blocked()  # still blocked while the change applied
        await holder.execute("ROLLBACK")

    await eventually(lambda: app_logs_in(primary), timeout=30)


async def test_a_lost_data_directory_of_an_initialised_cluster_is_cloned_never_initdb(
    fresh: Workspace, instances: list[Instance]
) -> None:
    primary = await start(instances, Instance(fresh, FIRST, "primary"))
    await primary.wait_ready()
    identifier = (await primary.status())["systemIdentifier"]
    fresh.write_config(BASE_PARAMETERS, [FIRST], system_identifier=identifier)

    # orders-2 was the primary once; its volume is empty now. Not listed yet: its clone waits for a slot
    lost = await start(instances, Instance(fresh, SECOND, "primary"), primary_port=primary.pg_port)

    async def reported() -> list[dict[str, Any]] | None:
        return problems(await lost.status(), "DataDirectoryLost") or None

    await eventually(lost.alive, timeout=30)
    [problem] = await eventually(reported, timeout=30)
    assert identifier in problem["message"]
    assert (await lost.get("/readyz"))[0] == 503

    fresh.write_config(BASE_PARAMETERS, [FIRST, SECOND], system_identifier=identifier)
    await lost.wait_ready(timeout=60)
    status = await lost.status()
    assert (status["role"], status["systemIdentifier"]) == ("replica", identifier)
    assert problems(status, "DataDirectoryLost") == []
    assert not [e for e in lost.log_events() if e["event"] == "initdb"]


def initdb_by_hand(pgdata: Path) -> None:
    """A data directory of some other cluster, made without the manager."""
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    chown_tree(pgdata.parents[1])
    user = run_as()
    subprocess.run(
        [str(PG_BIN / "initdb"), "-D", str(pgdata), "-U", "postgres", "--no-sync"],
        check=True,
        capture_output=True,
        user=None if user is None else user.pw_uid,
        group=None if user is None else user.pw_gid,
        extra_groups=None if user is None else [],
    )


async def test_a_foreign_data_directory_or_major_is_not_started_and_http_keeps_answering(
    fresh: Workspace, instances: list[Instance]
) -> None:
    fresh.write_config(BASE_PARAMETERS, [FIRST], system_identifier="1234567890")
    stray = Instance(fresh, FIRST, "primary")
    initdb_by_hand(stray.pgdata)
    await start(instances, stray)

    async def reported(reason: str) -> dict[str, Any] | None:
        try:
            status = await stray.status()
        except OSError:
            return None
        return status if problems(status, reason) else None

    status = await eventually(lambda: reported("SystemIdentifierMismatch"), timeout=30)
    assert "1234567890" in problems(status, "SystemIdentifierMismatch")[0]["message"]
    assert status["running"] is False
    assert (status["dataVersion"], status["binaryVersion"]) == (15, 15)
    assert not (stray.pgdata / "postmaster.pid").exists()
    code, body = await stray.get("/readyz")
    assert code == 503
    assert "system" in body["reason"]

    # the operator's config is fixed, but the data is a major the binaries cannot run
    (stray.pgdata / "PG_VERSION").write_text("14\n")
    fresh.write_config(BASE_PARAMETERS, [FIRST])
    status = await eventually(lambda: reported("DataVersionMismatch"), timeout=30)
    [problem] = problems(status, "DataVersionMismatch")
    assert "14" in problem["message"]
    assert "15" in problem["message"]
    assert (status["dataVersion"], status["binaryVersion"], status["running"]) == (14, 15, False)
    assert problems(status, "SystemIdentifierMismatch") == []

    # and once it matches, PostgreSQL starts
    (stray.pgdata / "PG_VERSION").write_text("15\n")
    await stray.wait_ready(timeout=60)


async def test_user_parameters_do_not_stop_the_manager_or_record_its_verifiers(
    fresh: Workspace, instances: list[Instance]
) -> None:
    # every session, the manager's included, gets the user's parameters: a read-only default would block its role
    # management, a search path would make it resolve names elsewhere, and pg_stat_statements (an allowed preload)
    # would keep the text of ALTER ROLE ... PASSWORD on disk
    hostile = {
        **BASE_PARAMETERS,
        "default_transaction_read_only": "on",
        "search_path": "nowhere",
        "lock_timeout": "1ms",
        "shared_preload_libraries": "pg_stat_statements",
        "pg_stat_statements.track_utility": "on",
        "log_statement": "all",
        "log_min_duration_statement": "0",
    }
    fresh.write_config(hostile, [FIRST])
    primary = await start(instances, Instance(fresh, FIRST, "primary"))
    await primary.wait_ready()
    assert await primary.query("SHOW default_transaction_read_only") == [("on",)]  # the user's setting is in force
    owner = await primary.query("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'orders'")
    assert owner == [("orders_owner",)]
    async with await primary.connect() as conn:
        await conn.execute("SET default_transaction_read_only = off")
        await conn.execute("SET search_path = public")
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    fresh.passwords["app"] = "rotated-under-pg-stat-statements"
    write_secret(fresh, "app", "password", fresh.passwords["app"].encode())

    await eventually(lambda: app_logs_in(primary), timeout=30)
    statements = await primary.query("SELECT query FROM public.pg_stat_statements")
    assert statements  # it records
    assert not [q for (q,) in statements if "SCRAM-SHA-256$" in q or "PASSWORD" in q.upper()]
    assert "SCRAM-SHA-256$" not in primary.output()


async def test_a_lowered_standby_limit_is_reported_so_the_primary_restarts_first(
    fresh: Workspace, instances: list[Instance]
) -> None:
    primary = await start(instances, Instance(fresh, FIRST, "primary"))
    await primary.wait_ready()

    async def reported() -> list[str] | None:
        status = await primary.status()
        return status["pendingRestartLowers"] if status["pendingRestart"] else None

    fresh.write_config({**BASE_PARAMETERS, "max_connections": "50"}, [FIRST])  # the default is 100
    assert await eventually(reported, timeout=15) == ["max_connections"]
    fresh.write_config({**BASE_PARAMETERS, "max_connections": "150"}, [FIRST])

    async def raised() -> bool:
        return await reported() == []

    await eventually(raised, timeout=15)
