"""A failover's Event that an operator killed mid-step never posted is posted by the next operator (issue 29 item 3),
against the real API server: the record in ``status.lastFailover`` is what the killed operator left behind."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest_asyncio

from kanri.local.controlplane import Endpoint
from kanri.postgres.ha.announce import ANNOUNCED
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import EVENT
from tests.integration.test_postgres_reconciler import pgc
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    await install_postgres_crd(client)
    return client


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_recorded_failover_whose_event_was_never_posted_is_told_once(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    now = datetime.now(UTC)
    record = {"time": _iso(now - timedelta(seconds=30)), "from": "told-1", "to": "told-2",
              "reason": "PrimaryUnreachable", "dataLossPossible": True, "lsnGapBytes": 4096, "timeline": 2}  # fmt: skip
    stale = {**record, "time": _iso(now - timedelta(hours=2)), "from": "old-1", "to": "old-2"}
    await client.create(POSTGRES_CLUSTER, pgc("told", namespace, replicas=2))
    await client.create(POSTGRES_CLUSTER, pgc("old", namespace, replicas=2))
    # what an operator killed right after writing the record (before its Event) leaves behind
    await client.patch_status(POSTGRES_CLUSTER, "told", {"status": {"lastFailover": record}}, namespace)
    await client.patch_status(POSTGRES_CLUSTER, "old", {"status": {"lastFailover": stale}}, namespace)

    async def failed_over(name: str) -> list[str]:
        items, _ = await client.list(EVENT, namespace)
        return [e["message"] for e in items if e["involvedObject"]["name"] == name and e["reason"] == "FailedOver"]

    async def marked() -> bool:
        cluster = await client.get(POSTGRES_CLUSTER, "told", namespace)
        return (cluster["metadata"].get("annotations") or {}).get(ANNOUNCED) == record["time"]

    async with Operator(control_plane, namespace).running(refresh=0.5):
        messages = await eventually(lambda: failed_over("told"), timeout=60)
        assert messages[0].startswith("promoted told-2 (timeline 2) after told-1 failed (PrimaryUnreachable)")
        assert "lacked 4096 bytes" in messages[0]
        await eventually(marked, timeout=30)
    # told once (a repeat would be a second Event or a count of 2 on this one), and never for a record hours old
    items, _ = await client.list(EVENT, namespace)
    told = [e for e in items if e["involvedObject"]["name"] == "told" and e["reason"] == "FailedOver"]
    assert [e.get("count", 1) for e in told] == [1]
    assert await failed_over("old") == []
