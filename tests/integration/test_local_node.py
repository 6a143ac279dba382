"""One local node on the real control plane: a Node kept Ready, local volumes (placed by the selected-node
annotation, which the tests set where kube-scheduler would). One node host for the whole module."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.node import LocalNode, NodeOptions
from kanri.local.node.kinds import NODE, NODE_LEASE_NAMESPACE, PERSISTENT_VOLUME, STORAGE_CLASS
from kanri.local.node.node import NodeAgent
from kanri.local.node.provisioner import storage_class
from kanri.runtime import ApiError, Client, get_condition, parse_quantity
from kanri.runtime.kinds import EVENT, LEASE, PVC
from tests.local_node_support import running_node, with_test_network
from tests.support import eventually

Obj = dict[str, Any]

# The control plane's --node-monitor-grace-period (controlplane/controllermanager.go; v1.37's default is 50 s).
NODE_MONITOR_GRACE_PERIOD = 20.0


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def node(control_plane: Endpoint, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalNode]:
    """A local node of its own (unique name, own volume dir, own client and caches), stopped and deleted after."""
    data_dir = tmp_path_factory.mktemp("node")
    options = with_test_network(NodeOptions(data_dir=data_dir, name=f"test-node-{secrets.token_hex(3)}"))
    async with running_node(control_plane.kubeconfig, options) as local:
        yield local


def claim(name: str, namespace: str, node: str, size: str = "1Gi", storage_class_name: str | None = None) -> Obj:
    """A claim placed on ``node`` as kube-scheduler places a WaitForFirstConsumer claim (``selected-node``)."""
    spec: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if storage_class_name:
        spec["storageClassName"] = storage_class_name
    annotations = {"volume.kubernetes.io/selected-node": node}
    return {"metadata": {"name": name, "namespace": namespace, "annotations": annotations}, "spec": spec}


def condition(obj: Obj, kind: str) -> Obj | None:
    return get_condition((obj.get("status") or {}).get("conditions"), kind)


async def events_for(client: Client, namespace: str, name: str, reason: str) -> list[Obj]:
    events, _ = await client.list(EVENT, namespace, field_selector=f"involvedObject.name={name}")
    return [e for e in events if e["reason"] == reason]


async def some_events(client: Client, namespace: str, name: str, reason: str) -> list[Obj] | None:
    """The Events of ``reason`` about ``name``, once there is one."""
    return await events_for(client, namespace, name, reason) or None


async def gone(read: Callable[[], Awaitable[object]]) -> bool:
    try:
        await read()
    except ApiError as exc:
        if exc.not_found:
            return True
        raise
    return False


# --- the Node ---------------------------------------------------------------------------------------------------------


async def test_node_registers_and_stays_ready_past_the_node_monitor_grace_period(
    client: Client, node: LocalNode, tmp_path: Path
) -> None:
    name = node.options.name
    registered = await client.get(NODE, name)
    status = registered["status"]
    assert parse_quantity(status["capacity"]["cpu"]) == os.cpu_count()  # one node: the whole machine
    assert status["capacity"]["pods"] == "110"
    assert status["capacity"]["memory"].endswith("Ki")
    assert int(status["capacity"]["memory"][:-2]) > 0
    assert status["allocatable"] == status["capacity"]
    assert {"type": "InternalIP", "address": node.options.internal_ip} in status["addresses"]
    assert registered["metadata"]["labels"]["kubernetes.io/hostname"] == name
    lease = await client.get(LEASE, name, NODE_LEASE_NAMESPACE)
    assert lease["spec"]["holderIdentity"] == name
    first_renew = lease["spec"]["renewTime"]

    # A control: a node that registers the same way and then falls silent. The node-lifecycle controller must mark
    # it Unknown after the grace period — proof that it is watching, so our node staying Ready means something.
    silent_name = f"{name}-silent"
    await NodeAgent(client, NodeOptions(data_dir=tmp_path / "silent", name=silent_name)).heartbeat()
    started = time.monotonic()
    try:

        async def silent_marked_unknown() -> bool:
            ready = condition(await client.get(NODE, silent_name), "Ready")
            return ready is not None and ready["status"] == "Unknown"

        await eventually(silent_marked_unknown, timeout=NODE_MONITOR_GRACE_PERIOD + 60, interval=1)
        assert time.monotonic() - started >= NODE_MONITOR_GRACE_PERIOD - 5  # the controller's own clock, roughly

        live = await client.get(NODE, name)
        ready = condition(live, "Ready")
        assert ready is not None
        assert (ready["status"], ready["reason"]) == ("True", "KanriNodeReady")
        heartbeat = datetime.fromisoformat(ready["lastHeartbeatTime"].replace("Z", "+00:00"))
        assert (datetime.now(UTC) - heartbeat).total_seconds() < 3 * node.options.heartbeat_interval
        assert not [t for t in live["spec"].get("taints", []) if t["key"].startswith("node.kubernetes.io/")]
        renewed = await client.get(LEASE, name, NODE_LEASE_NAMESPACE)
        assert renewed["spec"]["renewTime"] > first_renew
    finally:
        await client.delete(NODE, silent_name)


# --- volumes ----------------------------------------------------------------------------------------------------------


async def provisioned(client: Client, name: str, namespace: str) -> tuple[Obj, Obj]:
    """Wait until the claim is Bound; return it and its PV."""

    async def bound() -> Obj | None:
        current = await client.get(PVC, name, namespace)
        return current if current.get("status", {}).get("phase") == "Bound" else None

    current = await eventually(bound, timeout=60)
    return current, await client.get(PERSISTENT_VOLUME, current["spec"]["volumeName"])


@contextlib.asynccontextmanager
async def extra_class(client: Client, **settings: Any) -> AsyncIterator[str]:
    name = f"test-local-{secrets.token_hex(3)}"
    await client.create(STORAGE_CLASS, storage_class(name, default=False, **settings))
    try:
        yield name
    finally:
        await client.delete(STORAGE_CLASS, name)


async def test_a_claim_of_the_default_class_gets_a_directory_and_loses_it_on_delete(
    client: Client, node: LocalNode, namespace: str
) -> None:
    # No class: the default one is filled in on admission.
    await client.create(PVC, claim("data", namespace, node.options.name))
    current, volume = await provisioned(client, "data", namespace)
    assert current["spec"]["storageClassName"] == "kanri-local"
    assert current["status"]["capacity"]["storage"] == "1Gi"
    assert volume["metadata"]["name"] == f"pvc-{current['metadata']['uid']}"
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    assert volume["spec"]["claimRef"]["uid"] == current["metadata"]["uid"]
    path = Path(volume["spec"]["local"]["path"])
    assert path == node.options.volumes_dir.resolve() / volume["metadata"]["name"]
    assert await asyncio.to_thread(path.is_dir)
    await asyncio.to_thread((path / "PG_VERSION").write_text, "18\n")  # data in it must not stop the deletion

    await client.delete(PVC, "data", namespace)
    await eventually(lambda: gone(lambda: client.get(PERSISTENT_VOLUME, volume["metadata"]["name"])), timeout=60)
    assert not await asyncio.to_thread(path.exists)


async def test_a_retain_class_keeps_the_volume_and_its_directory(
    client: Client, node: LocalNode, namespace: str
) -> None:
    async with extra_class(client, reclaim_policy="Retain") as class_name:
        await client.create(PVC, claim("kept", namespace, node.options.name, storage_class_name=class_name))
        _, volume = await provisioned(client, "kept", namespace)
        name = volume["metadata"]["name"]
        path = Path(volume["spec"]["local"]["path"])
        await client.delete(PVC, "kept", namespace)

        async def released() -> bool:
            phase: str = (await client.get(PERSISTENT_VOLUME, name))["status"].get("phase")
            return phase == "Released"

        await eventually(released, timeout=60)
        await asyncio.sleep(3)  # give a wrong deletion the time to happen
        assert (await client.get(PERSISTENT_VOLUME, name))["status"]["phase"] == "Released"
        assert await asyncio.to_thread(path.is_dir)


async def test_a_larger_request_shows_up_in_the_claim_capacity(
    control_plane: Endpoint, client: Client, node: LocalNode, namespace: str
) -> None:
    await client.create(PVC, claim("growing", namespace, node.options.name, size="1Gi"))
    _, volume = await provisioned(client, "growing", namespace)
    await client.patch(PVC, "growing", {"spec": {"resources": {"requests": {"storage": "3Gi"}}}}, namespace)

    async def grown() -> Obj | None:
        current = await client.get(PVC, "growing", namespace)
        return current if current["status"].get("capacity", {}).get("storage") == "3Gi" else None

    current = await eventually(grown, timeout=30)
    # The controller-manager's expand controller left it to us, as it does for any external resizer.
    (handed_over,) = await eventually(
        lambda: some_events(client, namespace, "growing", "ExternalExpanding"), timeout=10
    )
    assert handed_over["message"] == "waiting for an external controller to expand this PVC"
    assert current["status"]["allocatedResources"] == {"storage": "3Gi"}
    assert not current["status"].get("allocatedResourceStatuses")
    assert (await client.get(PERSISTENT_VOLUME, volume["metadata"]["name"]))["spec"]["capacity"]["storage"] == "3Gi"
    kubectl = Path(sys.executable).parent / "kubectl"
    process = await asyncio.create_subprocess_exec(
        str(kubectl), "--kubeconfig", str(control_plane.kubeconfig), "get", "pvc", "growing", "-n", namespace,
        "-o", "custom-columns=CAPACITY:.status.capacity.storage", "--no-headers", stdout=subprocess.PIPE,
    )  # fmt: skip
    stdout, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0
    assert stdout.decode().strip() == "3Gi"  # what `kubectl get pvc` shows as CAPACITY


async def test_a_claim_larger_than_the_free_disk_stays_pending_with_a_warning(
    client: Client, node: LocalNode, namespace: str
) -> None:
    await client.create(PVC, claim("huge", namespace, node.options.name, size="1Ei"))
    (failed,) = await eventually(lambda: some_events(client, namespace, "huge", "ProvisioningFailed"), timeout=30)
    assert failed["type"] == "Warning"
    assert failed["message"].startswith("requested 1Ei but only "), failed["message"]
    assert f"is available on the filesystem of {node.options.volumes_dir.resolve()}" in failed["message"]
    current = await client.get(PVC, "huge", namespace)
    assert current["status"]["phase"] == "Pending"
    assert not current["spec"].get("volumeName")
    assert not await asyncio.to_thread((node.options.volumes_dir / f"pvc-{current['metadata']['uid']}").exists)


async def test_growing_a_claim_past_the_free_disk_is_refused_with_a_warning(
    client: Client, node: LocalNode, namespace: str
) -> None:
    await client.create(PVC, claim("greedy", namespace, node.options.name, size="1Gi"))
    _, volume = await provisioned(client, "greedy", namespace)
    await client.patch(PVC, "greedy", {"spec": {"resources": {"requests": {"storage": "1Ei"}}}}, namespace)
    (failed,) = await eventually(lambda: some_events(client, namespace, "greedy", "VolumeResizeFailed"), timeout=30)
    assert failed["message"].startswith("growing to 1Ei: requested 1023Pi more but only "), failed["message"]
    assert (await client.get(PVC, "greedy", namespace))["status"]["capacity"]["storage"] == "1Gi"
    assert (await client.get(PERSISTENT_VOLUME, volume["metadata"]["name"]))["spec"]["capacity"]["storage"] == "1Gi"


async def test_a_resize_on_a_class_without_expansion_is_refused(
    client: Client, node: LocalNode, namespace: str
) -> None:
    async with extra_class(client, allow_volume_expansion=False) as class_name:
        await client.create(PVC, claim("fixed", namespace, node.options.name, storage_class_name=class_name))
        await provisioned(client, "fixed", namespace)
        with pytest.raises(ApiError) as refused:
            await client.patch(PVC, "fixed", {"spec": {"resources": {"requests": {"storage": "2Gi"}}}}, namespace)
        assert refused.value.status == 403
        assert "storageclass that provisions the pvc must support resize" in refused.value.message
        assert (await client.get(PVC, "fixed", namespace))["spec"]["resources"]["requests"]["storage"] == "1Gi"
