"""Another application's look-alikes are never routed to nor deleted, and older clusters move to the stricter
selectors without a moment of lost routing: against the real API server and its EndpointSlice controller, with the
operator in process. No kubelet runs: the test binds the pods to a Node object and writes their status as a kubelet
would (the EndpointSlice controller needs only the Node to exist and the pod's IP); no PostgreSQL runs either.

A look-alike carries the very keys PostgreSQL uses (``kanri.dev/cluster: orders``, ``kanri.dev/role: primary``) and
another ``app.kubernetes.io/name`` (``valkey``) — the worst case of another operator reusing the product-wide keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from kanri.local.controlplane import Endpoint
from kanri.postgres.children.images import PostgresImages
from kanri.postgres.children.pvc import claim
from kanri.postgres.children.rbac import service_account
from kanri.postgres.children.services import services
from kanri.postgres.children.statefulset import postgres_image, statefulset
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.cluster.reconciler import validated_spec
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import APP_NAME, CLUSTER, INSTANCE, MANAGED_BY, PRIMARY, REPLICA, ROLE, Role, instance_labels
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import ENDPOINT_SLICE, NETWORK_POLICY, NODE, POD, PVC, SERVICE, SERVICE_ACCOUNT, STATEFUL_SET
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

Obj = dict[str, Any]
TOLERATE_ALL = [{"operator": "Exists"}]  # the Node has no kubelet: its taints must never evict the test's pods


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    await install_postgres_crd(client)
    return client


@pytest_asyncio.fixture(loop_scope="session")
async def node(client: Client) -> AsyncIterator[str]:
    """A Node object for the pods to be bound to (nothing runs on it)."""
    name = f"labels-{secrets.token_hex(3)}"
    await client.create(NODE, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiError):
            await client.delete(NODE, name)


def pgc(name: str, namespace: str) -> Obj:
    spec = {"version": 16, "replicas": 2, "storage": {"size": "1Gi"}, "deletionPolicy": "Delete",
            "podTemplate": {"tolerations": TOLERATE_ALL}}  # fmt: skip
    return {"apiVersion": POSTGRES_CLUSTER.api_version, "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}  # fmt: skip


def running(address: str) -> Obj:
    """A pod's status as a kubelet reports it once the pod runs and is ready."""
    now = "2026-12-06T00:00:00Z"
    return {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}],
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}  # fmt: skip


async def bind_and_run(client: Client, namespace: str, pod: str, node: str, address: str) -> None:
    """What the scheduler and a kubelet would do for ``pod``: bind it to ``node``, report it running at ``address``."""
    current = await client.get(POD, pod, namespace)
    if not current["spec"].get("nodeName"):
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
        await client.create_subresource(POD, pod, "binding", binding, namespace)
    await client.patch_status(POD, pod, {"status": running(address)}, namespace)


async def lookalike_pod(client: Client, namespace: str, name: str, labels: dict[str, str], node: str, address: str
                        ) -> Obj:  # fmt: skip
    """Another application's pod, down to the port name PostgreSQL's Services target."""
    container = {"name": "valkey", "image": "valkey:9", "ports": [{"name": "postgres", "containerPort": 5432}]}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": node, "containers": [container], "tolerations": TOLERATE_ALL}}  # fmt: skip
    created = await client.create(POD, body)
    await client.patch_status(POD, name, {"status": running(address)}, namespace)
    return created


async def lookalike_claim(client: Client, namespace: str, name: str, labels: dict[str, str]) -> Obj:
    body = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    return await client.create(PVC, body)


async def endpoints(client: Client, namespace: str, service: str) -> set[str]:
    """Every address the EndpointSlice controller publishes for ``service`` (ready or not)."""
    slices, _ = await client.list(ENDPOINT_SLICE, namespace, label_selector=f"kubernetes.io/service-name={service}")
    return {address for s in slices for e in s.get("endpoints") or () for address in e.get("addresses") or ()}


async def routing(client: Client, namespace: str, cluster: str) -> dict[str, set[str]]:
    return {suffix: await endpoints(client, namespace, f"{cluster}-{suffix}") for suffix in ("rw", "ro", "r")}


async def _pods_exist(client: Client, namespace: str, names: list[str]) -> bool:
    pods, _ = await client.list(POD, namespace)
    return set(names) <= {p["metadata"]["name"] for p in pods}


async def force_delete_pods(client: Client, namespace: str) -> None:
    """No kubelet confirms a pod's end here: remove them at once so the namespace can go."""
    pods, _ = await client.list(POD, namespace)
    for pod in pods:
        with contextlib.suppress(ApiError):
            await client.delete(POD, pod["metadata"]["name"], namespace, grace_period_seconds=0)


async def test_lookalikes_of_another_app_are_never_routed_to_nor_deleted(
    control_plane: Endpoint, client: Client, namespace: str, node: str
) -> None:
    valkey = {CLUSTER: "orders", MANAGED_BY: "kanri", APP_NAME: "valkey"}
    # Before the operator runs: another app's primary and replica pods, and claims — one named as PostgreSQL would
    # name a third instance, which a look-up by cluster name alone would count as an instance and remove on scale.
    alike_primary = await lookalike_pod(client, namespace, "valkey-orders-0", {**valkey, ROLE: "primary"}, node,
                                        "192.0.2.100")  # fmt: skip
    await lookalike_pod(client, namespace, "valkey-orders-1", {**valkey, ROLE: "replica"}, node, "192.0.2.101")
    alike_claims = {
        "orders-3": await lookalike_claim(client, namespace, "orders-3", {**valkey, INSTANCE: "orders-3"}),
        "data-valkey-orders-0": await lookalike_claim(client, namespace, "data-valkey-orders-0", valkey),
    }
    await client.create(POSTGRES_CLUSTER, pgc("orders", namespace))
    operator = Operator(control_plane, namespace, instances=HttpInstanceClient(timeout=0.5))
    try:
        async with operator.running(refresh=0.5):
            await eventually(lambda: _pods_exist(client, namespace, ["orders-1-0", "orders-2-0"]), timeout=60)
            await bind_and_run(client, namespace, "orders-1-0", node, "192.0.2.11")
            await bind_and_run(client, namespace, "orders-2-0", node, "192.0.2.12")
            wanted = {"rw": {"192.0.2.11"}, "ro": {"192.0.2.12"}, "r": {"192.0.2.11", "192.0.2.12"}}

            async def routed() -> dict[str, set[str]] | None:
                found = await routing(client, namespace, "orders")
                return found if found == wanted else None

            await eventually(routed, timeout=60)
            # The look-alikes stay out while the operator keeps reconciling (several passes at refresh 0.5 s).
            for _ in range(10):
                assert await routing(client, namespace, "orders") == wanted
                await asyncio.sleep(0.3)
            sets, _ = await client.list(STATEFUL_SET, namespace)
            assert sorted(s["metadata"]["name"] for s in sets) == ["orders-1", "orders-2"]  # no orders-3 adopted
            alike = await client.get(POD, "valkey-orders-0", namespace)
            assert alike["metadata"]["labels"] == alike_primary["metadata"]["labels"]  # never relabelled

            # deletionPolicy: Delete removes PostgreSQL's claims, and only those.
            await client.delete(POSTGRES_CLUSTER, "orders", namespace)

            async def cluster_gone() -> bool:
                try:
                    await client.get(POSTGRES_CLUSTER, "orders", namespace)
                except ApiError as exc:
                    return exc.not_found
                return False

            await eventually(cluster_gone, timeout=60)
        claims, _ = await client.list(PVC, namespace)
        by_name = {c["metadata"]["name"]: c for c in claims}
        for name in ("orders-1", "orders-2"):  # deleted (kept only by pvc-protection while their pods end)
            assert name not in by_name or by_name[name]["metadata"].get("deletionTimestamp"), name
        for name, made in alike_claims.items():
            assert by_name[name]["metadata"]["uid"] == made["metadata"]["uid"], name
            assert not by_name[name]["metadata"].get("deletionTimestamp"), name
        pods, _ = await client.list(POD, namespace)
        alive = {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}
        assert {"valkey-orders-0", "valkey-orders-1"} <= alive
    finally:
        await force_delete_pods(client, namespace)


async def _older_cluster(client: Client, namespace: str, name: str) -> Obj:
    """A cluster as an operator without the app name label left it: claims, StatefulSets (selector and pod template)
    and Services with the older labels only."""
    cluster = await client.create(POSTGRES_CLUSTER, pgc(name, namespace))
    spec = validated_spec(cluster)
    await client.create(SERVICE_ACCOUNT, service_account(cluster))  # the pods' admission looks it up
    image = postgres_image(spec, 16, None, PostgresImages.from_environment())
    roles: tuple[tuple[int, Role], ...] = ((1, PRIMARY), (2, REPLICA))
    for n, role in roles:
        instance = f"{name}-{n}"
        volume = claim(cluster, instance, "1Gi", None)
        volume["metadata"]["labels"] = instance_labels(name, instance, by_app=False)
        await client.create(PVC, volume)
        sts = statefulset(cluster, spec, instance, role=role, image=image, running=True, by_app=False)
        sts["metadata"]["labels"] = instance_labels(name, instance, by_app=False)
        await client.create(STATEFUL_SET, sts)
    for service in services(cluster, by_app=False, by_reads=False):  # made before either label existed
        service["metadata"]["labels"] = {CLUSTER: name, MANAGED_BY: "kanri"}
        await client.create(SERVICE, service)
    return cluster


async def test_an_older_cluster_moves_to_the_app_name_without_losing_routing(
    control_plane: Endpoint, client: Client, namespace: str, node: str
) -> None:
    await _older_cluster(client, namespace, "older")
    try:
        await eventually(lambda: _pods_exist(client, namespace, ["older-1-0", "older-2-0"]), timeout=60)
        pod_uids: dict[str, str] = {}
        for n, address in ((1, "192.0.2.21"), (2, "192.0.2.22")):
            pod = f"older-{n}-0"
            await bind_and_run(client, namespace, pod, node, address)
            role = "primary" if n == 1 else "replica"  # as the earlier operator had labelled them
            patched = await client.patch(POD, pod, {"metadata": {"labels": {ROLE: role}}}, namespace)
            assert APP_NAME not in patched["metadata"]["labels"]
            pod_uids[pod] = patched["metadata"]["uid"]
        wanted = {"rw": {"192.0.2.21"}, "ro": {"192.0.2.22"}, "r": {"192.0.2.21", "192.0.2.22"}}

        async def routed() -> dict[str, set[str]] | None:
            found = await routing(client, namespace, "older")
            return found if wanted == found else None

        await eventually(routed, timeout=60)
        # A look-alike the older selectors still route to, until the switch.
        labels = {CLUSTER: "older", ROLE: "replica", APP_NAME: "valkey"}
        await lookalike_pod(client, namespace, "valkey-older-0", labels, node, "192.0.2.120")
        await eventually(lambda: _contains(routing(client, namespace, "older"), "ro", "192.0.2.120"), timeout=60)

        lost: list[dict[str, set[str]]] = []

        async def watch_routing() -> None:
            # Sampled all through the move: every instance stays routed at every sample.
            while True:
                found = await routing(client, namespace, "older")
                if not all(wanted[s] <= found[s] for s in wanted):
                    lost.append(found)
                await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch_routing())
        operator = Operator(control_plane, namespace, instances=HttpInstanceClient(timeout=0.5))
        try:
            async with operator.running(refresh=0.5):

                async def switched() -> bool:
                    rw = await client.get(SERVICE, "older-rw", namespace)
                    return bool(rw["spec"]["selector"].get(APP_NAME) == "postgresql")

                await eventually(switched, timeout=60)
                await eventually(routed, timeout=60)  # the look-alike is out once the selectors switched
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        assert lost == [], lost[:3]
        for n in (1, 2):
            found = await client.get(POD, f"older-{n}-0", namespace)
            assert found["metadata"]["uid"] == pod_uids[f"older-{n}-0"]  # labelled in place, never restarted
            assert found["metadata"]["labels"][APP_NAME] == "postgresql"
            volume = await client.get(PVC, f"older-{n}", namespace)
            assert volume["metadata"]["labels"][APP_NAME] == "postgresql"
            sts = await client.get(STATEFUL_SET, f"older-{n}", namespace)
            # the immutable selector, and the pod template, are what they were
            assert sts["spec"]["selector"] == {"matchLabels": {CLUSTER: "older", INSTANCE: f"older-{n}"}}
            assert APP_NAME not in sts["spec"]["template"]["metadata"]["labels"]
        for service in ("older-rw", "older-ro", "older-r"):
            assert (await client.get(SERVICE, service, namespace))["spec"]["selector"][APP_NAME] == "postgresql"
        # The NetworkPolicy keeps isolating by cluster name while a StatefulSet can still make an unlabelled pod.
        policy = await client.get(NETWORK_POLICY, "older", namespace)
        assert policy["spec"]["podSelector"] == {"matchLabels": {CLUSTER: "older"}}
    finally:
        await force_delete_pods(client, namespace)


async def _contains(found: Any, suffix: str, address: str) -> bool:
    return address in (await found)[suffix]
