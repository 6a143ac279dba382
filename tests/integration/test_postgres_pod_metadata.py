"""podTemplate labels and annotations reach the running pods in place, against the real API server and StatefulSet
controller: the pods keep their uid, the StatefulSets their revision, no rollout begins; removed keys leave the pods,
keys kanri did not apply stay. The harness (instance managers doubled at HTTP, a stand-in kubelet) is the rolling
update tests' (:mod:`tests.integration.test_postgres_primary_update`)."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_asyncio

from kanri.local.controlplane import Endpoint
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import POD, STATEFUL_SET
from tests.integration.test_postgres_failover import event_reasons, status_of
from tests.integration.test_postgres_primary_update import running_cluster
from tests.integration.test_postgres_reconciler import pgc
from tests.postgres_support import install_postgres_crd
from tests.support import eventually

Obj = dict[str, Any]
PODS = ("pm-1-0", "pm-2-0")
ROLLOUT_EVENTS = {"UpdatedInstance", "RestartingInstance", "SwitchoverStarted", "SwitchedOver"}


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    await install_postgres_crd(client)
    return client


async def pods_of(client: Client, namespace: str) -> dict[str, Obj]:
    return {name: (await client.get(POD, name, namespace))["metadata"] for name in PODS}


async def revisions(client: Client, namespace: str) -> dict[str, tuple[Any, Any]]:
    found = {}
    for instance in ("pm-1", "pm-2"):
        status = (await client.get(STATEFUL_SET, instance, namespace)).get("status") or {}
        found[instance] = (status.get("currentRevision"), status.get("updateRevision"))
    return found


async def test_labels_and_annotations_are_applied_and_removed_in_place_without_a_rollout(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    async with running_cluster(control_plane, client, namespace, "pm"):
        before = await pods_of(client, namespace)
        uids = {name: meta["uid"] for name, meta in before.items()}
        revision = await revisions(client, namespace)
        # a label someone else put on a pod: kanri never applied it, so it never removes it
        await client.patch(POD, "pm-2-0", {"metadata": {"labels": {"by-hand": "yes"}}}, namespace)
        template = {"labels": {"team": "payments"}, "annotations": {"example.com/owner": "ops"}}
        await client.patch(POSTGRES_CLUSTER, "pm", {"spec": {"podTemplate": template}}, namespace)

        async def applied() -> dict[str, Obj] | None:
            pods = await pods_of(client, namespace)
            ok = all((m.get("labels") or {}).get("team") == "payments"
                     and (m.get("annotations") or {}).get("example.com/owner") == "ops"
                     for m in pods.values())  # fmt: skip
            return pods if ok else None

        await eventually(applied, timeout=30)
        removed = {"labels": {"team": None}, "annotations": {"example.com/owner": None}}
        await client.patch(POSTGRES_CLUSTER, "pm", {"spec": {"podTemplate": removed}}, namespace)

        async def gone() -> dict[str, Obj] | None:
            pods = await pods_of(client, namespace)
            ok = all("team" not in (m.get("labels") or {})
                     and "example.com/owner" not in (m.get("annotations") or {}) for m in pods.values())  # fmt: skip
            return pods if ok else None

        after = await eventually(gone, timeout=30)
        assert {name: meta["uid"] for name, meta in after.items()} == uids  # never restarted
        assert after["pm-2-0"]["labels"]["by-hand"] == "yes"
        assert await revisions(client, namespace) == revision  # the StatefulSets never had a new template
        reasons = set(await event_reasons(client, namespace, "pm"))
        assert not reasons & ROLLOUT_EVENTS, reasons
        status = await status_of(client, namespace, "pm")
        assert status.get("phase") == "Ready", status
        assert "failover" not in status, status


async def test_the_operators_and_the_statefulset_controllers_labels_are_refused(client: Client, namespace: str) -> None:
    body = pgc("px", namespace, replicas=1, podTemplate={"labels": {"controller-revision-hash": "x", "team": "a"}})
    with pytest.raises(ApiError) as refused:
        await client.create(POSTGRES_CLUSTER, body)
    message = 'labels ["controller-revision-hash"] belong to the operator or the StatefulSet controller'
    assert message in str(refused.value)
