"""The chart's Cache operator RBAC on the real API server: the Cache controller, authenticated as a ServiceAccount
token bound to exactly the ClusterRole and Lease Role ``helm template --set cache.enabled=true`` renders, takes its
Lease, writes every child of a Cache — the agents' Role included, which RBAC accepts only from an identity holding
what the Role grants — reports its status, and deletes the Cache's data per ``deletionPolicy`` with no request
refused. tests/unit/test_cache_chart.py checks the same rules against the code; this checks them against RBAC."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry

from kanri.cache.api import KIND, Cache
from kanri.cache.operator import controller
from kanri.local.controlplane import Endpoint
from kanri.runtime import Client, Manager, ManagerOptions, get_condition, install_crd
from kanri.runtime._connection import in_cluster
from kanri.runtime.kinds import (
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
    CONFIG_MAP,
    LEASE,
    ROLE,
    ROLE_BINDING,
    SECRET,
    SERVICE,
    SERVICE_ACCOUNT,
    STATEFUL_SET,
)
from tests.helm_support import Obj, of_kind, template
from tests.integration.test_cache_agent_labels import ca_file
from tests.support import NotYet, eventually, exists

NAME = "kanri-cache-operator"


def named(objects: list[Obj], kind: str, name: str) -> Obj:
    (found,) = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    return found


async def install_rbac(client: Client, namespace: str) -> None:
    """The chart's ServiceAccount, ClusterRole, ClusterRoleBinding and Lease Role + RoleBinding, released into the
    test's namespace (the cluster-scoped names carry it, so sessions and reruns do not collide)."""
    objects = template("cache.enabled=true", namespace=namespace)
    role, binding = named(objects, "ClusterRole", NAME), named(objects, "ClusterRoleBinding", NAME)
    role["metadata"]["name"] = binding["metadata"]["name"] = binding["roleRef"]["name"] = f"{NAME}-{namespace}"
    await client.create(SERVICE_ACCOUNT, named(objects, "ServiceAccount", NAME))
    await client.create(CLUSTER_ROLE, role)
    await client.create(CLUSTER_ROLE_BINDING, binding)
    await client.create(ROLE, named(objects, "Role", f"{NAME}-leader-election"))
    await client.create(ROLE_BINDING, named(objects, "RoleBinding", f"{NAME}-leader-election"))


async def operator_token_dir(client: Client, control_plane: Endpoint, namespace: str, tmp_path: Path) -> Path:
    """What the kubelet mounts into the operator's pod: its ServiceAccount's token and the cluster's CA."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 900}}
    answer = await client.create_subresource(SERVICE_ACCOUNT, NAME, "token", request, namespace)
    mounted = tmp_path / "serviceaccount"
    mounted.mkdir()
    (mounted / "token").write_text(answer["status"]["token"])
    (mounted / "ca.crt").write_bytes(ca_file(control_plane, tmp_path).read_bytes())
    return mounted


async def test_the_charts_rules_let_the_cache_operator_do_its_whole_job(
    client: Client, control_plane: Endpoint, namespace: str, tmp_path: Path
) -> None:
    await install_crd(client, Cache, field_manager="kanri-tests")
    await install_rbac(client, namespace)
    server = urlsplit(control_plane.server)
    environ = {"KUBERNETES_SERVICE_HOST": str(server.hostname), "KUBERNETES_SERVICE_PORT": str(server.port)}
    connection = in_cluster(await operator_token_dir(client, control_plane, namespace, tmp_path), environ)
    registry = CollectorRegistry()
    async with Client(connection) as as_operator:
        options = ManagerOptions(name=f"cache-operator-{namespace}", namespace=namespace, health_port=None,
                                 leader_election_namespace=namespace)  # fmt: skip
        manager = Manager(as_operator, options, registry=registry)
        manager.add(controller(manager))
        task = asyncio.create_task(manager.run(handle_signals=False))
        try:
            await _a_cache_lives_and_dies(client, namespace, registry)
        finally:
            manager.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 20)


async def _a_cache_lives_and_dies(client: Client, namespace: str, registry: CollectorRegistry) -> None:
    spec = {"dataPolicy": "Durable", "replicas": 3, "storage": {"size": "1Gi"}, "deletionPolicy": "Delete"}
    await client.create(KIND, {"metadata": {"name": "rbac", "namespace": namespace}, "spec": spec})
    seen: list[object] = []

    async def no_primary() -> bool:
        status = (await client.get(KIND, "rbac", namespace)).get("status") or {}
        ready = get_condition(status.get("conditions"), "Ready")
        seen.append(ready)
        return ready is not None and ready["reason"] == "NoPrimary"

    # the status patch comes after every child was written (NoPrimary: no node runs the pods)
    try:
        await eventually(no_primary, timeout=60)
    except NotYet as exc:
        raise AssertionError(f"{exc}; Ready was {seen[-1:]}") from None
    children = [(STATEFUL_SET, "rbac"), (CONFIG_MAP, "rbac-config"), (SERVICE, "rbac-rw"), (SECRET, "rbac-password"),
                (SERVICE_ACCOUNT, "rbac-agent"), (ROLE, "rbac-agent"), (ROLE_BINDING, "rbac-agent")]  # fmt: skip
    for kind, name in children:
        assert await exists(client, kind, name, namespace), f"{kind.kind} {name} was not written"
    assert await exists(client, LEASE, f"cache-operator-{namespace}", namespace), "no Lease taken"
    errors = registry.get_sample_value("controller_runtime_reconcile_errors_total", {"controller": "cache"})
    assert not errors, f"{errors} reconciles failed (a refused request?)"

    await client.delete(KIND, "rbac", namespace)

    async def left() -> list[str]:
        return [f"{kind.kind} {name}" for kind, name in ((KIND, "rbac"), (SECRET, "rbac-password"))
                if await exists(client, kind, name, namespace)]  # fmt: skip

    # deletionPolicy Delete: the password deleted, then the finalizer patched away
    remaining: list[str] = []

    async def all_gone() -> bool:
        remaining[:] = await left()
        return not remaining

    try:
        await eventually(all_gone, timeout=30)
    except NotYet as exc:
        raise AssertionError(f"{exc}; still there: {remaining}") from None
