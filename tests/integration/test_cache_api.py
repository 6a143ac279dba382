"""The Cache API on the real API server: the generated CRD installs, safe specs are accepted with their defaults, and
every unsafe combination is refused with its own message."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from kanri.cache.api import KIND, Cache
from kanri.local.controlplane import Endpoint
from kanri.runtime import ApiError, Client, crd_for
from kanri.runtime.kinds import CRD
from tests.support import eventually

DURABLE: dict[str, Any] = {"dataPolicy": "Durable", "replicas": 3, "storage": {"size": "1Gi"}}
REGENERABLE: dict[str, Any] = {"dataPolicy": "Regenerable", "replicas": 3}


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def installed(control_plane: Endpoint) -> AsyncIterator[None]:
    """The generated CRD applied (cluster-scoped: it stays for the session) and Established."""
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        await client.apply(CRD, crd_for(Cache), field_manager="kanri-tests")

        async def established() -> bool:
            crd = await client.get(CRD, Cache.resource.crd_name)
            conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            assert conditions.get("NonStructuralSchema") != "True", crd["status"]
            return conditions.get("Established") == "True"

        await eventually(established, timeout=30)
        yield


def cache(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


async def refused(write: Any) -> str:
    with pytest.raises(ApiError) as error:
        await write
    assert error.value.status == 422, error.value.body
    return error.value.message


pytestmark = pytest.mark.usefixtures("installed")


async def test_a_durable_cache_is_stored_with_its_defaults(client: Client, namespace: str) -> None:
    created = await client.create(KIND, cache("orders", namespace, DURABLE))
    assert created["spec"]["deletionPolicy"] == "Retain"
    assert created["spec"]["version"] == "9.1"


async def test_a_regenerable_cache_needs_no_storage(client: Client, namespace: str) -> None:
    created = await client.create(KIND, cache("sessions", namespace, REGENERABLE))
    assert "storage" not in created["spec"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"replicas": 3}, "dataPolicy: Required value"),
        (REGENERABLE | {"durability": {"appendfsync": "always"}}, "durability (append-only file) applies to Durable"),
        (REGENERABLE | {"storage": {"size": "1Gi"}}, "storage applies to Durable caches only"),
        ({"dataPolicy": "Durable", "replicas": 3}, "a Durable cache needs storage"),
        (DURABLE | {"replicas": 1}, "a Durable cache needs replicas >= 2"),
        (DURABLE | {"eviction": "allkeys-lru"}, "a Durable cache may not evict keys"),
        (REGENERABLE | {"readPolicy": {"serveFrom": "Replicas"}}, "needs maxLagSeconds or maxLagBytes"),
        (REGENERABLE | {"readPolicy": {"maxLagSeconds": 5}}, "apply only when serveFrom is Replicas"),
    ],
    ids=[
        "no-policy",
        "regenerable-fsync",
        "regenerable-storage",
        "durable-no-storage",
        "durable-one-pod",
        "durable-evicts",
        "replicas-unbounded",
        "lag-without-replicas",
    ],
)
async def test_unsafe_combinations_are_refused(client: Client, namespace: str, spec: dict[str, Any],
                                               message: str) -> None:  # fmt: skip
    assert message in await refused(client.create(KIND, cache("bad", namespace, spec)))


async def test_data_policy_is_fixed_and_storage_never_shrinks(client: Client, namespace: str) -> None:
    await client.create(KIND, cache("orders", namespace, DURABLE))
    changed = client.patch(KIND, "orders", {"spec": {"dataPolicy": "Regenerable", "storage": None}}, namespace)
    assert "dataPolicy is fixed at creation" in await refused(changed)
    shrunk = client.patch(KIND, "orders", {"spec": {"storage": {"size": "512Mi"}}}, namespace)
    assert "storage.size may not shrink (from 1Gi to 512Mi)" in await refused(shrunk)
    grown = await client.patch(KIND, "orders", {"spec": {"storage": {"size": "2Gi"}}}, namespace)
    assert grown["spec"]["storage"]["size"] == "2Gi"


async def test_replicas_may_read_within_a_stated_lag(client: Client, namespace: str) -> None:
    spec = REGENERABLE | {"readPolicy": {"serveFrom": "Replicas", "maxLagSeconds": 2}}
    created = await client.create(KIND, cache("reads", namespace, spec))
    assert created["spec"]["readPolicy"] == {"serveFrom": "Replicas", "maxLagSeconds": 2}
