"""The PostgresPooler API on the real API server (issue 29 item 6): defaults stored, operator-owned PgBouncer settings
and unknown modes refused with their own messages, the cluster fixed at creation."""

from __future__ import annotations

from typing import Any

import pytest

from kanri.postgres.kinds import POSTGRES_POOLER
from kanri.runtime import ApiError, Client
from tests.postgres_support import install_postgres_crd

pytestmark = pytest.mark.timeout(120)


def pooler(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": POSTGRES_POOLER.api_version, "kind": "PostgresPooler",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"cluster": "orders", **spec}}  # fmt: skip


async def _refusal(client: Client, obj: dict[str, Any]) -> str:
    with pytest.raises(ApiError) as refused:
        await client.create(POSTGRES_POOLER, obj)
    assert refused.value.status == 422, refused.value
    return refused.value.message


async def test_defaults_refusals_and_the_fixed_cluster(client: Client, namespace: str) -> None:
    await install_postgres_crd(client)
    made = await client.create(POSTGRES_POOLER, pooler("p", namespace, parameters={"default_pool_size": "5"}))
    assert made["spec"] == {"cluster": "orders", "type": "rw", "instances": 2, "mode": "transaction",
                            "parameters": {"default_pool_size": "5"}}  # fmt: skip

    owned = await _refusal(client, pooler("q", namespace, parameters={"listen_port": "6432"}))
    assert "the operator owns the others" in owned, owned
    assert "listen_port" in owned, owned
    auth = await _refusal(client, pooler("q", namespace, parameters={"auth_query": "SELECT 1"}))
    assert "spec.parameters" in auth, auth
    assert "statement" in await _refusal(client, pooler("q", namespace, mode="statement"))
    assert "instances" in await _refusal(client, pooler("q", namespace, instances=17))
    newline = await _refusal(client, pooler("q", namespace, parameters={"max_client_conn": "1\nlisten_port = 1"}))
    assert "max_client_conn" in newline, newline

    with pytest.raises(ApiError) as moved:
        await client.patch(POSTGRES_POOLER, "p", {"spec": {"cluster": "other"}}, namespace)
    assert "spec.cluster is immutable" in moved.value.message, moved.value.message
