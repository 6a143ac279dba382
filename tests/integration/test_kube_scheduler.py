"""The real kube-scheduler inside the control plane places pods as on any cluster: required anti-affinity, resource
fit, taints and tolerations, topology spread over zones, with its own FailedScheduling messages.

Scheduling needs no kubelet, so this module registers three Nodes itself (one per zone) and renews their Leases as a
kubelet would. That keeps the node-lifecycle controller (grace period 20 s here) from marking them unreachable, and
lets it lift the ``node.kubernetes.io/not-ready:NoSchedule`` taint that the TaintNodesByCondition admission plugin
puts on every new Node until the controller has seen it Ready — the same path a real node takes. The last test adds
a fourth Node that never renews its Lease, to see the control plane's test-cluster timings (docs/local.md,
"Timings") take it out of service.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest_asyncio

from kanri.local.controlplane import Endpoint
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import EVENT, LEASE, NODE, POD
from tests.support import eventually

Obj = dict[str, Any]

ZONES = ("zone-a", "zone-b", "zone-c")
CAPACITY = {"cpu": "4", "memory": "8Gi", "pods": "110"}
NODE_LEASE_NAMESPACE = "kube-node-lease"
HEARTBEAT_SECONDS = 3.0
"""Between Lease renewals; well inside the controller manager's --node-monitor-grace-period (20 s)."""
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


@dataclass(frozen=True)
class ZonedNodes:
    """The module's Nodes: ``names[i]`` is in ``ZONES[i]``."""

    names: tuple[str, ...]

    def zone_of(self, name: str) -> str:
        return ZONES[self.names.index(name)]


def micro_time(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_body(name: str, zone: str, now: datetime) -> Obj:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "TestNodeReady",
        "message": "registered by test_kube_scheduler",
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }
    return {
        "metadata": {"name": name, "labels": {HOSTNAME: name, ZONE: zone, "kubernetes.io/os": "linux"}},
        "spec": {},
        # A Node keeps the status it is created with (nodes may set status on create), so it is Ready at once.
        "status": {"capacity": CAPACITY, "allocatable": CAPACITY, "conditions": [ready]},
    }


async def register_node(client: Client, name: str, zone: str) -> None:
    """A Ready Node and its Lease in kube-node-lease, as a kubelet registers them."""
    now = datetime.now(UTC)
    await client.create(NODE, node_body(name, zone, now))
    lease = {
        "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro_time(now)},
    }
    await client.create(LEASE, lease)


async def renew_leases(client: Client, names: tuple[str, ...]) -> None:
    """What a kubelet's node-lease controller does: a fresh ``renewTime`` on every Node's Lease, until cancelled."""
    while True:
        await asyncio.sleep(HEARTBEAT_SECONDS)
        renew = {"spec": {"renewTime": micro_time(datetime.now(UTC))}}
        for name in names:
            await client.patch(LEASE, name, renew, NODE_LEASE_NAMESPACE)


def taints(node: Obj) -> list[Obj]:
    return list(node.get("spec", {}).get("taints") or [])


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def nodes(control_plane: Endpoint) -> AsyncIterator[ZonedNodes]:
    """Three heartbeating Nodes, one per zone, untainted by the node-lifecycle controller; all gone afterwards."""
    token = secrets.token_hex(3)
    names = tuple(f"sched-{zone}-{token}" for zone in ZONES)
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        # The scheduler's messages count every Node ("0/3 nodes are available"): wait out another module's Node that
        # is still being deleted.
        await eventually(lambda: none_of(client, None), timeout=120)
        for name, zone in zip(names, ZONES, strict=True):
            await register_node(client, name, zone)
        heartbeat = asyncio.create_task(renew_leases(client, names))
        try:
            await eventually(lambda: untainted(client, names), timeout=60)
            yield ZonedNodes(names)
        finally:
            heartbeat.cancel()
            await asyncio.wait([heartbeat])
            await remove_nodes(client, names)
        if not heartbeat.cancelled() and (error := heartbeat.exception()) is not None:
            raise error  # the Nodes may have turned unreachable mid-module: say why


async def none_of(client: Client, names: tuple[str, ...] | None) -> bool:
    """True when none of the Nodes ``names`` (None: no Node at all) exists."""
    items, _ = await client.list(NODE)
    return not any(names is None or item["metadata"]["name"] in names for item in items)


async def untainted(client: Client, names: tuple[str, ...]) -> list[Obj] | None:
    """The Nodes once none carries a taint (the controller removed not-ready after seeing Ready=True)."""
    found = [await client.get(NODE, name) for name in names]
    return found if not any(taints(node) for node in found) else None


async def remove_nodes(client: Client, names: tuple[str, ...]) -> None:
    """Pods bound to the Nodes go first, at once (there is no kubelet to finish a graceful deletion), then Leases and
    Nodes."""
    for name in names:
        pods, _ = await client.list(POD, field_selector=f"spec.nodeName={name}")
        for pod in pods:
            await client.delete(POD, pod["metadata"]["name"], pod["metadata"]["namespace"], grace_period_seconds=0)
        await client.delete(LEASE, name, NODE_LEASE_NAMESPACE)
        await client.delete(NODE, name)
    await eventually(lambda: none_of(client, names), timeout=60)


@pytest_asyncio.fixture(loop_scope="session")
async def ns(namespace: str, nodes: ZonedNodes, client: Client) -> AsyncIterator[str]:
    """The test's namespace; its pods are removed at once afterwards (bound ones would wait for a kubelet)."""
    try:
        yield namespace
    finally:
        pods, _ = await client.list(POD, namespace)
        for pod in pods:
            await client.delete(POD, pod["metadata"]["name"], namespace, grace_period_seconds=0)


def pod_body(namespace: str, name: str, labels: dict[str, str] | None = None, *, cpu: str = "10m", **spec: Any) -> Obj:
    """A one-container Pod (nothing runs it: only its placement is looked at); ``spec`` adds pod-spec fields."""
    container = {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": cpu}}}
    metadata = {"name": name, "namespace": namespace, "labels": labels or {}}
    return {"metadata": metadata, "spec": {"containers": [container], **spec}}


def node_of(pod: Obj) -> str | None:
    node = pod.get("spec", {}).get("nodeName")
    return str(node) if node else None


def unschedulable(pod: Obj) -> Obj | None:
    """The PodScheduled condition when the scheduler has tried and failed."""
    condition: Obj | None = get_condition(pod.get("status", {}).get("conditions") or [], "PodScheduled")
    if condition and condition["status"] == "False" and condition.get("reason") == "Unschedulable":
        return condition
    return None


async def pods_in(client: Client, namespace: str) -> list[Obj]:
    items, _ = await client.list(POD, namespace)
    return items


async def bound(client: Client, namespace: str, name: str) -> str | None:
    return node_of(await client.get(POD, name, namespace))


async def pending_because(client: Client, namespace: str, name: str) -> str | None:
    condition = unschedulable(await client.get(POD, name, namespace))
    return str(condition["message"]) if condition else None


async def test_required_hostname_anti_affinity_places_three_of_four_pods_on_three_nodes(
    client: Client, nodes: ZonedNodes, ns: str
) -> None:
    labels = {"app": "spread"}
    anti_affinity = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": labels}, "topologyKey": HOSTNAME}
            ]
        }
    }
    for i in range(4):
        await client.create(POD, pod_body(ns, f"spread-{i}", labels, affinity=anti_affinity))

    async def placement() -> tuple[dict[str, str], list[Obj]] | None:
        pods = await pods_in(client, ns)
        placed = {p["metadata"]["name"]: node for p in pods if (node := node_of(p))}
        waiting = [p for p in pods if unschedulable(p)]
        return (placed, waiting) if len(placed) == 3 and len(waiting) == 1 else None

    placed, [waiting] = await eventually(placement, timeout=60)
    assert sorted(placed.values()) == sorted(nodes.names)
    condition = unschedulable(waiting)
    assert condition is not None
    assert condition["message"] == (
        "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules. "
        "preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
    )

    # Freeing a node lets the scheduler retry the waiting pod there: a pod deletion is one of the cluster events that
    # move it out of the unschedulable queue.
    freed_pod, freed_node = next(iter(placed.items()))
    await client.delete(POD, freed_pod, ns, grace_period_seconds=0)
    name = waiting["metadata"]["name"]
    assert await eventually(lambda: bound(client, ns, name), timeout=60) == freed_node


async def test_a_pod_asking_for_more_cpu_than_any_node_has_gets_failed_scheduling_insufficient_cpu(
    client: Client, nodes: ZonedNodes, ns: str
) -> None:
    await client.create(POD, pod_body(ns, "greedy", cpu="64"))

    async def failed_scheduling() -> list[Obj]:
        events, _ = await client.list(EVENT, ns, field_selector="involvedObject.name=greedy,reason=FailedScheduling")
        return events

    [event, *_] = await eventually(failed_scheduling, timeout=60)
    assert event["type"] == "Warning"
    assert event["reportingComponent"] == "default-scheduler"
    assert "Insufficient cpu" in event["message"]
    assert event["message"] == (
        "0/3 nodes are available: 3 Insufficient cpu. "
        "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    )
    assert node_of(await client.get(POD, "greedy", ns)) is None


async def test_a_tainted_node_takes_only_pods_that_tolerate_the_taint(
    client: Client, nodes: ZonedNodes, ns: str
) -> None:
    target = nodes.names[2]
    taint = {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
    on_target = {HOSTNAME: target}
    await client.patch(NODE, target, {"spec": {"taints": [taint]}})
    try:
        await client.create(POD, pod_body(ns, "intolerant", nodeSelector=on_target))
        toleration = {"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}
        await client.create(POD, pod_body(ns, "tolerant", nodeSelector=on_target, tolerations=[toleration]))

        assert await eventually(lambda: bound(client, ns, "tolerant"), timeout=60) == target
        message = await eventually(lambda: pending_because(client, ns, "intolerant"), timeout=60)
        assert message == (
            "0/3 nodes are available: 1 node(s) had untolerated taint(s), "
            "2 node(s) didn't match Pod's node affinity/selector. "
            "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        )
    finally:
        await client.patch(NODE, target, {"spec": {"taints": None}})


async def test_topology_spread_over_zones_puts_two_of_six_pods_in_each_zone(
    client: Client, nodes: ZonedNodes, ns: str
) -> None:
    labels = {"app": "zonal"}
    spread = [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": labels}}]  # fmt: skip
    for i in range(6):
        await client.create(POD, pod_body(ns, f"zonal-{i}", labels, topologySpreadConstraints=spread))

    async def all_placed() -> list[str] | None:
        placed = [node for pod in await pods_in(client, ns) if (node := node_of(pod))]
        return placed if len(placed) == 6 else None

    placed = await eventually(all_placed, timeout=60)
    per_zone = {zone: sum(nodes.zone_of(node) == zone for node in placed) for zone in ZONES}
    # After every single placement the skew is at most 1, so six pods can only end two per zone.
    assert per_zone == dict.fromkeys(ZONES, 2)


@pytest_asyncio.fixture(loop_scope="session")
async def silent_node(client: Client, nodes: ZonedNodes) -> AsyncIterator[str]:
    """A fourth Node, in a zone of its own, whose Lease is never renewed after registration: a node that died."""
    name = f"sched-silent-{secrets.token_hex(3)}"
    await register_node(client, name, "zone-d")
    try:
        yield name
    finally:
        await remove_nodes(client, (name,))


async def test_a_node_whose_heartbeats_stop_turns_unknown_and_its_pods_are_evicted(
    client: Client, silent_node: str, ns: str
) -> None:
    # Bound directly (as a static or pre-assigned pod would be) so there is no race with the node going NotReady.
    await client.create(POD, pod_body(ns, "stranded", nodeName=silent_node))
    pod = await client.get(POD, "stranded", ns)
    # The DefaultTolerationSeconds admission plugin gave the pod the API server's configured 30 s (default 300 s).
    assert {(t["key"], t.get("tolerationSeconds")) for t in pod["spec"]["tolerations"]} == {
        ("node.kubernetes.io/not-ready", 30),
        ("node.kubernetes.io/unreachable", 30),
    }

    async def unreachable() -> Obj | None:
        # The controller writes the Unknown status first, then the taint: wait for the second.
        node = await client.get(NODE, silent_node)
        keys = {(t["key"], t["effect"]) for t in taints(node)}
        return node if ("node.kubernetes.io/unreachable", "NoExecute") in keys else None

    # With the controller manager's defaults (50 s grace, then 300 s toleration) these waits would run out.
    node = await eventually(unreachable, timeout=90)
    ready = get_condition(node["status"]["conditions"], "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("Unknown", "NodeStatusUnknown")
    assert ready["message"] == "Kubelet stopped posting node status."

    async def evicted() -> Obj | None:
        current = await client.get(POD, "stranded", ns)
        condition = get_condition(current["status"].get("conditions") or [], "DisruptionTarget")
        return condition if current["metadata"].get("deletionTimestamp") and condition else None

    condition = await eventually(evicted, timeout=120)
    assert condition["reason"] == "DeletionByTaintManager"
    # The other zones' Nodes are healthy, so this is one failed node, not a control-plane outage: evictions go on
    # (were every zone disrupted, the node-lifecycle controller would stop evicting, as in any cluster).
