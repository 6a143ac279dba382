"""Changing a credential Secret rotates that role's password in the database (issue 16 item 4), end to end: the
kubelet refreshes the pod's Secret volume, the instance manager sees the file change and sets the new password, and
the old one stops working. The secret scan (tests/e2e/secret_scan.py) then checks neither password leaked."""

from __future__ import annotations

import base64
import secrets

import psycopg

from kanri.local.node import LocalNode
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import SECRET
from tests.e2e.postgres_helpers import cluster, cluster_ip, connect, credentials, ready_with_row
from tests.postgres_support import Operator
from tests.support import eventually


async def logs_in(host: str, user: str, password: str) -> bool:
    try:
        async with await connect(host, user, password) as conn:
            await conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


async def test_a_changed_app_password_works_and_the_old_one_is_refused(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster("keys", namespace, 1))
    async with operator.running(refresh=2.0):
        await ready_with_row(client, namespace, "keys", 1)
        user, old = await credentials(client, namespace, "keys")
        host = await cluster_ip(client, namespace, "keys-rw")
        assert await logs_in(host, user, old)

        new = secrets.token_urlsafe(24)
        patch = {"data": {"password": base64.b64encode(new.encode()).decode()}}
        await client.patch(SECRET, "keys-app", patch, namespace)

        async def rotated() -> bool:
            return await logs_in(host, user, new)

        await eventually(rotated, timeout=90, interval=1)
        assert not await logs_in(host, user, old)
        # The operator keeps the user's password: it never regenerates a Secret that exists.
        assert (await credentials(client, namespace, "keys"))[1] == new
