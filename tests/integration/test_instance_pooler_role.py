"""``POST /pooler/role`` against a real primary (issue 29 item 6), and the roles' verifiers kept across a restart.

The instance manager and PostgreSQL are the real ones of tests/integration/test_instance_manager.py (its fixtures):
the lookup role logs in with the password whose verifier the request carried, ``user_lookup`` answers the
application owner's stored verifier and nothing for the superuser, the role itself or an unknown name, only the
lookup role may call it, and a restart of the primary keeps every role's verifier (same salt: PgBouncer's SCRAM
pass-through keys stay valid, docs/pooler.md).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from kanri.contract.pooler import POOLER_ROLE
from kanri.contract.scram import verifier
from tests.integration.test_instance_manager import Instance, Workspace, primary, workspace

__all__ = ["primary", "workspace"]  # the fixtures, imported to be used here

pytestmark = pytest.mark.timeout(180)
VERIFIERS = "SELECT rolname, rolpassword FROM pg_authid WHERE rolname IN ('postgres', 'orders_owner') ORDER BY 1"


async def _lookup(instance: Instance, password: str, name: str) -> list[tuple[object, ...]]:
    options: dict[str, Any] = {"host": "127.0.0.1", "port": instance.pg_port, "dbname": "orders", "autocommit": True}
    async with await psycopg.AsyncConnection.connect(user=POOLER_ROLE, password=password, **options) as conn:
        cursor = await conn.execute("SELECT usename, passwd FROM kanri_pooler.user_lookup(%s)", (name,))
        return list(await cursor.fetchall())


async def test_the_pooler_role_looks_up_ordinary_roles_only_and_verifiers_survive_a_restart(
    workspace: Workspace, primary: Instance
) -> None:
    password = "pooler-password-1"
    code, body = await primary.post_json(
        "/pooler/role", workspace.token, {"verifier": "plaintext", "databases": ["orders"]}
    )
    assert code == 400, body
    request = {"verifier": verifier(password), "databases": ["orders"]}
    code, body = await primary.post_json("/pooler/role", workspace.token, request)
    assert (code, body) == (200, {"ensured": True, "role": POOLER_ROLE})
    code, body = await primary.post_json("/pooler/role", workspace.token, request)  # idempotent
    assert code == 200, body

    stored = dict(await primary.query(VERIFIERS))
    assert await _lookup(primary, password, "orders_owner") == [("orders_owner", stored["orders_owner"])]
    for name in ("postgres", POOLER_ROLE, "streaming_replica", "nobody"):
        assert await _lookup(primary, password, name) == [], name
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await primary.query("SELECT * FROM kanri_pooler.user_lookup('orders_owner')", role="app", dbname="orders")
    attributes = await primary.query(f"SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls "
                                     f"FROM pg_roles WHERE rolname = '{POOLER_ROLE}'")  # fmt: skip
    assert attributes == [(False, False, False, False, False)]

    # a restart of the primary ensures the roles again (ready waits for it) and keeps each verifier as it was
    assert await primary.stop() == 0
    await primary.start()
    await primary.wait_ready()
    assert dict(await primary.query(VERIFIERS)) == stored
    assert await _lookup(primary, password, "orders_owner") == [("orders_owner", stored["orders_owner"])]
