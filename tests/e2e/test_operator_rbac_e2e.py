"""Least privilege, proven: the operator installed by the chart runs as a pod under its own ServiceAccount and does
its work — create a cluster, scale it 1→2, delete it (deletionPolicy Delete: claims and Secrets too) — with no more
rights than the chart grants; and the real ``kubectl auth can-i --as`` shows that identity is denied everything it
must never do. The allowed checks next to the denials prove the identity is the operator's, not an unknown one that
would be denied everything."""

from __future__ import annotations

import asyncio
import secrets
import sys
from pathlib import Path

import pytest

from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import PVC, SECRET
from tests.e2e.postgres_helpers import cluster, gone, names, ready
from tests.helm_support import CHART, helm_async
from tests.support import eventually

KUBECTL = Path(sys.executable).parent / "kubectl"

# What the operator's identity must never be able to do, as `kubectl auth can-i` arguments (the watched namespace
# is added to the namespaced ones).
NEVER_CLUSTER = [
    ["create", "clusterroles"],
    ["create", "clusterrolebindings"],
    ["bind", "clusterroles"],
    ["escalate", "clusterroles"],
    ["impersonate", "users"],
    ["impersonate", "serviceaccounts"],
    ["delete", "namespaces"],
    ["delete", "nodes"],
    ["create", "mutatingwebhookconfigurations.admissionregistration.k8s.io"],
    ["patch", "validatingwebhookconfigurations.admissionregistration.k8s.io"],
    ["create", "customresourcedefinitions.apiextensions.k8s.io"],
]
NEVER_NAMESPACED = [
    ["create", "roles"],
    ["create", "rolebindings"],
    ["bind", "roles"],
    ["escalate", "roles"],
    ["create", "pods", "--subresource=exec"],
    ["get", "pods", "--subresource=exec"],
    ["create", "pods", "--subresource=attach"],
    ["create", "serviceaccounts", "--subresource=token"],
    ["update", "statefulsets"],
]
ALLOWED_NAMESPACED = [
    ["patch", "statefulsets.apps"],
    ["delete", "pods"],  # the restore rehearsal's throwaway pod (docs/security.md)
    ["delete", "persistentvolumeclaims"],
    ["patch", "postgresclusters.kanri.dev", "--subresource=status"],
]


async def can_i(control_plane: Endpoint, identity: str, *args: str) -> str:
    """``kubectl auth can-i`` as ``identity``: "yes" or "no" (exit 1 means no; anything else fails the test)."""
    process = await asyncio.create_subprocess_exec(
        str(KUBECTL), f"--kubeconfig={control_plane.kubeconfig}", "auth", "can-i", f"--as={identity}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    answer = out.decode().strip()
    assert process.returncode in (0, 1), (args, process.returncode, err.decode())
    assert answer in ("yes", "no"), (args, answer)
    return answer


@pytest.mark.timeout(400)
async def test_the_operator_works_under_its_service_account_and_is_denied_what_it_must_never_do(
    client: Client, node: LocalNode, control_plane: Endpoint, namespace: str, tmp_path: Path
) -> None:
    release = f"kanri-{secrets.token_hex(3)}"
    identity = f"system:serviceaccount:{namespace}:{release}-operator"
    kubeconfig = ["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    home = tmp_path / "helm"
    await helm_async("install", release, str(CHART), *kubeconfig, "--set", f"watchNamespaces={{{namespace}}}",
                     "--wait", "--timeout", "300s", home=home)  # fmt: skip
    try:
        # Everything below is the in-cluster operator's work under the chart's RBAC; a missing right would leave
        # the cluster short of Ready (a Forbidden write becomes a condition, not a success).
        await client.create(POSTGRES_CLUSTER, cluster("stock", namespace, 1, deletionPolicy="Delete"))
        await eventually(lambda: ready(client, namespace, "stock", 1), timeout=180, interval=1)
        await client.patch(POSTGRES_CLUSTER, "stock", {"spec": {"replicas": 2}}, namespace)
        await eventually(lambda: ready(client, namespace, "stock", 2), timeout=180, interval=1)
        await client.delete(POSTGRES_CLUSTER, "stock", namespace)
        await eventually(lambda: gone(client, namespace, "stock"), timeout=120, interval=1)
        assert await names(client, PVC, namespace, "stock") == []
        assert await names(client, SECRET, namespace, "stock") == []

        for args in ALLOWED_NAMESPACED:
            assert await can_i(control_plane, identity, *args, "-n", namespace) == "yes", args
        for args in NEVER_NAMESPACED:
            assert await can_i(control_plane, identity, *args, "-n", namespace) == "no", args
        for args in NEVER_CLUSTER:
            assert await can_i(control_plane, identity, *args) == "no", args
        # Namespaced mode: nothing at all in a namespace it does not watch.
        assert await can_i(control_plane, identity, "list", "secrets", "-n", "default") == "no"
    finally:
        await helm_async("uninstall", release, *kubeconfig, "--wait", "--timeout", "120s", home=home)
