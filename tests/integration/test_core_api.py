"""Plain API semantics on the real kube-apiserver: CRUD, optimistic concurrency, namespace lifecycle."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support import eventually, is_gone, status_message


async def test_namespaced_configmap_create_get_update_delete(kube_api: k8s.ApiClient, namespace: str) -> None:
    core = k8s.CoreV1Api(kube_api)
    body = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="settings"), data={"mode": "fast"})

    created = await core.create_namespaced_config_map(namespace, body)
    assert created.metadata.uid
    assert created.metadata.namespace == namespace

    fetched = await core.read_namespaced_config_map("settings", namespace)
    assert fetched.data == {"mode": "fast"}

    fetched.data["mode"] = "safe"
    updated = await core.replace_namespaced_config_map("settings", namespace, fetched)
    assert updated.data == {"mode": "safe"}
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)

    with pytest.raises(ApiException) as duplicate:
        await core.create_namespaced_config_map(namespace, body)
    assert duplicate.value.status == 409

    await core.delete_namespaced_config_map("settings", namespace)
    assert await is_gone(lambda: core.read_namespaced_config_map("settings", namespace))


async def test_lease_update_with_stale_resource_version_is_a_conflict(kube_api: k8s.ApiClient, namespace: str) -> None:
    coordination = k8s.CoordinationV1Api(kube_api)
    lease = await coordination.create_namespaced_lease(
        namespace,
        k8s.V1Lease(
            metadata=k8s.V1ObjectMeta(name="leader"),
            spec=k8s.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15),
        ),
    )
    stale_version = lease.metadata.resource_version

    lease.spec.holder_identity = "b"
    taken = await coordination.replace_namespaced_lease("leader", namespace, lease)
    assert taken.spec.holder_identity == "b"

    lease.spec.holder_identity = "c"
    lease.metadata.resource_version = stale_version
    with pytest.raises(ApiException) as conflict:
        await coordination.replace_namespaced_lease("leader", namespace, lease)
    assert conflict.value.status == 409
    assert "the object has been modified" in status_message(conflict.value)

    current = await coordination.read_namespaced_lease("leader", namespace)
    assert current.spec.holder_identity == "b"


async def test_namespace_deletion_completes_and_removes_its_contents(kube_api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(kube_api)
    name = "doomed-namespace"
    await core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    await core.create_namespaced_config_map(name, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="content")))
    await core.create_namespaced_secret(name, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="secret")))

    await core.delete_namespace(name)
    terminating = await core.read_namespace(name)
    assert terminating.status.phase == "Terminating"

    # The namespace controller (in kube-controller-manager) empties it, then the namespace finalizer is dropped.
    await eventually(lambda: is_gone(lambda: core.read_namespace(name)), timeout=90)
    with pytest.raises(ApiException) as missing:
        await core.read_namespaced_config_map("content", name)
    assert missing.value.status == 404
