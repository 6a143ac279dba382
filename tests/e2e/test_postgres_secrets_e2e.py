"""Changing a credential Secret rotates that role's password in the database (issue 16 item 4), end to end: the
kubelet refreshes the pod's Secret volume, the instance manager sees the file change and sets the new password, and
the old one stops working. The secret scan (tests/e2e/secret_scan.py) then checks none of the passwords leaked.

Every credential Secret is the user's (created once, adopted, never overwritten): the app owner's, the superuser's
(``<cluster>-superuser``) and the replication role's (``<cluster>-replication``, role ``streaming_replica``, SCRAM
over TLS, no client certificate). The primary's manager runs ``ALTER ROLE`` with the new password; every manager
rewrites its libpq passfile, which a standby's WAL receiver reads on each (re)connect, so the live stream goes on
and a reconnect — the walsender ended or the standby restarted — authenticates with the new password."""

from __future__ import annotations

import base64
import secrets

import psycopg

from kanri.contract.roles import REPLICATION_USER, SUPERUSER
from kanri.local.node import LocalNode
from kanri.postgres import names
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import POD, SECRET
from tests.e2e.postgres_helpers import (
    cluster,
    cluster_ip,
    connect,
    credentials,
    every_instance_has,
    pods_of,
    ready,
    ready_with_row,
    write_row,
)
from tests.postgres_support import Operator
from tests.support import eventually


async def logs_in(host: str, user: str, password: str, database: str = "app") -> bool:
    try:
        async with await connect(host, user, password, database) as conn:
            await conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


async def password_of(client: Client, namespace: str, secret: str) -> str:
    data = (await client.get(SECRET, secret, namespace))["data"]
    return base64.b64decode(data["password"]).decode()


async def set_password(client: Client, namespace: str, secret: str) -> str:
    """Patch ``secret``'s password with a new random one (as a user would) and return it."""
    new = secrets.token_urlsafe(24)
    await client.patch(SECRET, secret, {"data": {"password": base64.b64encode(new.encode()).decode()}}, namespace)
    return new


async def rotate(client: Client, namespace: str, host: str, secret: str, user: str) -> str:
    """A new password in ``secret``: once it logs ``user`` in through ``host`` (``-rw``), the old one must not. The
    new password."""
    old = await password_of(client, namespace, secret)
    assert await logs_in(host, user, old, "postgres")
    new = await set_password(client, namespace, secret)

    async def rotated() -> bool:
        return await logs_in(host, user, new, "postgres")

    await eventually(rotated, timeout=90, interval=1)
    assert not await logs_in(host, user, old, "postgres")
    return new


async def test_a_changed_app_password_works_and_the_old_one_is_refused(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster("keys", namespace, 1))
    async with operator.running(refresh=2.0):
        await ready_with_row(client, namespace, "keys", 1)
        user, old = await credentials(client, namespace, "keys")
        host = await cluster_ip(client, namespace, "keys-rw")
        assert await logs_in(host, user, old)

        new = await set_password(client, namespace, names.app_secret("keys"))

        async def rotated() -> bool:
            return await logs_in(host, user, new)

        await eventually(rotated, timeout=90, interval=1)
        assert not await logs_in(host, user, old)
        # The operator keeps the user's password: it never regenerates a Secret that exists.
        assert (await credentials(client, namespace, "keys"))[1] == new


async def senders(host: str, password: str) -> list[tuple[int, str]] | None:
    """(walsender pid, standby name) of every standby streaming from the primary behind ``host``, read as the
    superuser (pg_stat_replication shows the state to privileged roles only); None while that cannot be read."""
    try:
        async with await connect(host, SUPERUSER, password, "postgres") as conn:
            cursor = await conn.execute(
                "SELECT pid, application_name FROM pg_stat_replication WHERE state = 'streaming' ORDER BY pid"
            )
            return [(int(r[0]), str(r[1])) for r in await cursor.fetchall()]
    except psycopg.Error:
        return None


async def test_superuser_and_replication_passwords_rotate_and_the_replica_keeps_streaming(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    name = "pair"
    await client.create(POSTGRES_CLUSTER, cluster(name, namespace, 2))
    async with operator.running(refresh=2.0):
        await ready_with_row(client, namespace, name, 2)
        host = await cluster_ip(client, namespace, names.read_write_service(name))
        primary = str((await client.get(POSTGRES_CLUSTER, name, namespace))["status"]["currentPrimary"])
        replica = next(
            p["metadata"]["name"]
            for p in await pods_of(client, namespace, name)
            if p["metadata"]["name"] != names.pod_name(primary)
        )

        # The superuser: the new password logs in through -rw, the old one is refused.
        superuser = names.superuser_secret(name)
        superuser_password = await rotate(client, namespace, host, superuser, SUPERUSER)
        streaming = await eventually(lambda: senders(host, superuser_password), timeout=30, interval=1)
        assert len(streaming) == 1, streaming

        # The replication role: the primary takes the new password and refuses the old one.
        replication = names.replication_secret(name)
        replication_password = await rotate(client, namespace, host, replication, REPLICATION_USER)

        # The live stream is not disturbed: a row written after the change reaches the replica.
        await write_row(client, namespace, name, 2)
        await eventually(lambda: every_instance_has(client, namespace, name, [1, 2]), timeout=60, interval=1)
        assert await senders(host, superuser_password) == streaming

        async def reconnected(before: list[tuple[int, str]]) -> list[tuple[int, str]] | None:
            now = await senders(host, superuser_password)
            old_pids = {pid for pid, _ in before}
            if now is None or len(now) != 1 or now[0][0] in old_pids:
                return None
            return now

        # The walsender ended: the replica's WAL receiver reconnects, and only the new password can authenticate it.
        async with await connect(host, SUPERUSER, superuser_password, "postgres") as conn:
            await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_replication")
        streaming = await eventually(lambda: reconnected(streaming), timeout=90, interval=1)
        await write_row(client, namespace, name, 3)
        await eventually(lambda: every_instance_has(client, namespace, name, [1, 2, 3]), timeout=60, interval=1)

        # The replica restarts (a new pod, a new PostgreSQL): it streams again with the new password.
        uid = (await client.get(POD, replica, namespace))["metadata"]["uid"]
        await client.delete(POD, replica, namespace)

        async def replaced() -> bool:
            pods = {p["metadata"]["name"]: p for p in await pods_of(client, namespace, name)}
            return replica in pods and pods[replica]["metadata"]["uid"] != uid

        await eventually(replaced, timeout=90, interval=1)
        streaming = await eventually(lambda: reconnected(streaming), timeout=120, interval=1)
        await eventually(lambda: ready(client, namespace, name, 2), timeout=120, interval=1)
        await write_row(client, namespace, name, 4)
        await eventually(lambda: every_instance_has(client, namespace, name, [1, 2, 3, 4]), timeout=60, interval=1)

        # The operator keeps the user's passwords: it never regenerates a Secret that exists.
        assert await password_of(client, namespace, superuser) == superuser_password
        assert await password_of(client, namespace, replication) == replication_password
