"""A KafkaCluster's volumes grown on a real API server and controller manager (no broker needed): the StatefulSet's
claim template cannot change, so the operator keeps it as made and raises each bound claim's request instead — the
StatefulSet stays writable (a scale-up in the same change still lands; before, the refused template froze it), the
claims ask for the new size, and those whose capacity has not followed are listed in ``status.resizingVolumes``. A
claim whose StorageClass cannot expand is named in ``Degraded=True, VolumeExpansionRefused`` with the API server's
reason."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry

from kanri.kafka.api import CLUSTER_KIND
from kanri.kafka.cluster.reconciler import controller as cluster_controller
from kanri.runtime import ApiError, Client, Manager, ManagerOptions, get_condition
from kanri.runtime.kinds import PERSISTENT_VOLUME, PVC, STATEFUL_SET, STORAGE_CLASS
from tests.integration.test_kafka_topics import client
from tests.support import eventually

__all__ = ["client"]

Obj = dict[str, Any]


@contextlib.asynccontextmanager
async def operator(client: Client, namespace: str) -> AsyncIterator[None]:
    options = ManagerOptions(name="kafka-operator", namespace=namespace, leader_election=False, health_port=0,
                             graceful_shutdown_timeout=10)  # fmt: skip
    manager = Manager(client, options, registry=CollectorRegistry())
    manager.add(cluster_controller(manager, registry=CollectorRegistry()))
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        yield
    finally:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


async def storage_class(client: Client, name: str, expands: bool) -> None:
    body = {"metadata": {"name": name}, "provisioner": "kanri.test/none", "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": expands}  # fmt: skip
    with contextlib.suppress(ApiError):
        await client.create(STORAGE_CLASS, body)


async def volume_for(client: Client, namespace: str, claim: str, storage_class_name: str) -> None:
    """A pre-bound 1Gi volume for ``claim`` (what a provisioner would have made), so the claim binds."""
    name = f"pv-{namespace}-{claim}"[:63]
    body = {"metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": storage_class_name, "hostPath": {"path": f"/tmp/{name}"},
                     "claimRef": {"namespace": namespace, "name": claim},
                     "persistentVolumeReclaimPolicy": "Delete"}}  # fmt: skip
    await client.create(PERSISTENT_VOLUME, body)


async def claims_bound(client: Client, namespace: str, names: list[str]) -> list[Obj] | None:
    found = []
    for name in names:
        try:
            claim = await client.get(PVC, name, namespace)
        except ApiError:
            return None
        if (claim.get("status") or {}).get("phase") != "Bound":
            return None
        found.append(claim)
    return found


async def grown(client: Client, namespace: str, names: list[str], size: str) -> list[Obj] | None:
    claims = await claims_bound(client, namespace, names) or []
    requests = [c["spec"]["resources"]["requests"]["storage"] for c in claims]
    return claims if claims and all(r == size for r in requests) else None


async def status_says(client: Client, namespace: str, name: str, field: str) -> Obj | None:
    obj = await client.get(CLUSTER_KIND, name, namespace)
    status = obj.get("status") or {}
    current = status.get("observedGeneration") == obj["metadata"]["generation"]
    return status if current and status.get(field) else None


async def degraded(client: Client, namespace: str, name: str, reason: str) -> Obj | None:
    status = (await client.get(CLUSTER_KIND, name, namespace)).get("status") or {}
    condition = get_condition(status.get("conditions") or [], "Degraded") or {}
    return condition if condition.get("reason") == reason else None


async def statefulset(client: Client, namespace: str, name: str, replicas: int) -> Obj | None:
    found = await client.get(STATEFUL_SET, name, namespace)
    return found if found["spec"]["replicas"] == replicas else None


async def test_volumes_grow_on_their_claims_and_a_class_that_cannot_expand_is_named(
    client: Client, namespace: str
) -> None:
    await storage_class(client, "kanri-test-expands", True)
    await storage_class(client, "kanri-test-fixed", False)
    names = [f"data-events-{n}" for n in range(3)]
    for name in names:
        await volume_for(client, namespace, name, "kanri-test-expands")
    await volume_for(client, namespace, "data-rigid-0", "kanri-test-fixed")
    async with operator(client, namespace):
        storage = {"size": "1Gi", "storageClassName": "kanri-test-expands"}
        await client.create(CLUSTER_KIND, {"metadata": {"name": "events", "namespace": namespace},
                                           "spec": {"replicas": 3, "storage": storage}})  # fmt: skip
        await eventually(lambda: claims_bound(client, namespace, names), timeout=60)

        # the volumes grow and a broker is added in one change: both land
        change = {"spec": {"replicas": 4, "storage": {"size": "2Gi"}}}
        await client.patch(CLUSTER_KIND, "events", change, namespace)
        made = await eventually(lambda: statefulset(client, namespace, "events", 4), timeout=30)
        assert made["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
        await eventually(lambda: grown(client, namespace, names, "2Gi"), timeout=30)
        status = await eventually(lambda: status_says(client, namespace, "events", "resizingVolumes"), timeout=30)
        # no expander runs here: the capacity stays 1Gi, so every grown claim is still resizing
        assert status["resizingVolumes"] == names, status
        assert await degraded(client, namespace, "events", "ChildRejected") is None

        # a class without allowVolumeExpansion: the API server refuses, the status says which claim and why
        rigid = {"size": "1Gi", "storageClassName": "kanri-test-fixed"}
        await client.create(CLUSTER_KIND, {"metadata": {"name": "rigid", "namespace": namespace},
                                           "spec": {"replicas": 1, "storage": rigid}})  # fmt: skip
        await eventually(lambda: claims_bound(client, namespace, ["data-rigid-0"]), timeout=60)
        await client.patch(CLUSTER_KIND, "rigid", {"spec": {"storage": {"size": "2Gi"}}}, namespace)
        refused = await eventually(lambda: degraded(client, namespace, "rigid", "VolumeExpansionRefused"), timeout=30)
        assert "claim data-rigid-0 cannot grow to 2Gi" in refused["message"], refused
        assert "allow" in refused["message"].lower(), refused
    for name in [*names, "data-rigid-0"]:
        with contextlib.suppress(ApiError):
            await client.delete(PERSISTENT_VOLUME, f"pv-{namespace}-{name}"[:63])
