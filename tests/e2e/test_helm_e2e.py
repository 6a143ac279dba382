"""The Helm chart end to end: `helm install` runs the operator as a pod of the local node under the chart's
ServiceAccount and RBAC, a PostgresCluster becomes Ready, and `helm uninstall` removes the operator only: the cluster,
its volume claims and its data stay, and a reinstalled operator takes the cluster over again. First, a `helm
upgrade` over an older operator's CRD: the new operator pod brings it up to its own (docs/helm.md).

The chart is installed in namespaced mode, watching the test's own namespace: the control plane is shared by the
whole session, and a cluster-wide operator would reconcile the other tests' clusters too."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from kanri import __version__
from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.operator import operator_crds
from kanri.runtime import ApiError, Client, Kind
from kanri.runtime._crd_upgrade import DIGEST_ANNOTATION, VERSION_ANNOTATION, crd_digest
from kanri.runtime.kinds import CLUSTER_ROLE, CRD, DEPLOYMENT, POD, PVC, ROLE
from tests.e2e.postgres_helpers import cluster, cluster_ip, credentials, gone, names, ready, rows_on, write_row
from tests.helm_support import CHART, helm_async
from tests.support import eventually

CLUSTER_CRD = operator_crds()[0]["metadata"]["name"]  # postgresclusters.kanri.dev


async def absent(client: Client, kind: Kind, name: str, namespace: str | None = None) -> bool:
    try:
        await client.get(kind, name, namespace)
    except ApiError as exc:
        return exc.not_found
    return False


async def operator_pods(client: Client, namespace: str) -> list[str]:
    pods = (await client.list(POD, namespace, label_selector="app.kubernetes.io/name=kanri-operator"))[0]
    return [p["metadata"]["name"] for p in pods]


# Two installs, a cluster provisioned and a finalizer run: more than the suite's 300 s default on a busy machine.
@pytest.mark.timeout(600)
async def test_helm_install_runs_the_operator_and_uninstall_keeps_the_cluster_and_its_data(
    client: Client, node: LocalNode, control_plane: Endpoint, namespace: str, tmp_path: Path
) -> None:
    release = f"kanri-{secrets.token_hex(3)}"
    operator = f"{release}-operator"
    kubeconfig = ["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    install = ["install", release, str(CHART), *kubeconfig, "--set", f"watchNamespaces={{{namespace}}}",
               "--wait", "--timeout", "300s"]  # fmt: skip
    home = tmp_path / "helm"
    await helm_async(*install, home=home)
    installed = True
    try:
        # --wait returned: the operator's pod passed its readiness probe (its caches synced under the chart's RBAC).
        assert len(await operator_pods(client, namespace)) == 1
        # `helm upgrade` over an older operator's CRD (Helm never updates crds/): the new pod replaces it with its
        # own before it serves, under the chart's RBAC (docs/helm.md, "Upgrades and the CRDs").
        older = {VERSION_ANNOTATION: "0.0.1", DIGEST_ANNOTATION: "0" * 16}
        await client.patch(CRD, CLUSTER_CRD, {"metadata": {"annotations": older}})
        await helm_async("upgrade", release, str(CHART), *kubeconfig, "--reuse-values", "--set-string",
                         "podAnnotations.e2e/rollout=upgraded", "--wait", "--timeout", "120s", home=home)  # fmt: skip
        stamped = (await client.get(CRD, CLUSTER_CRD))["metadata"]["annotations"]
        assert stamped[VERSION_ANNOTATION] == __version__, stamped
        assert stamped[DIGEST_ANNOTATION] == crd_digest(operator_crds()[0]), stamped
        await client.create(POSTGRES_CLUSTER, cluster("inventory", namespace, 1))
        await eventually(lambda: ready(client, namespace, "inventory", 1), timeout=240, interval=1)
        await write_row(client, namespace, "inventory", 42)
        claims = await names(client, PVC, namespace, "inventory")
        assert claims == ["inventory-1"]

        await helm_async("uninstall", release, *kubeconfig, "--wait", "--timeout", "120s", home=home)
        installed = False
        # The operator and its RBAC are gone, cluster-scoped part included ...
        assert await absent(client, DEPLOYMENT, operator, namespace)
        assert await absent(client, ROLE, operator, namespace)
        assert await absent(client, CLUSTER_ROLE, f"{operator}-cluster")
        await eventually(lambda: absent_pods(client, namespace), timeout=60)
        # ... the CRD (Helm never deletes crds/), the cluster, its claims and its data are not.
        assert (await client.get(POSTGRES_CLUSTER, "inventory", namespace))["metadata"]["name"] == "inventory"
        assert await names(client, PVC, namespace, "inventory") == claims
        user, password = await credentials(client, namespace, "inventory")
        host = await cluster_ip(client, namespace, "inventory-rw")
        assert await eventually(lambda: rows_on(host, user, password), timeout=30) == [42]

        # A reinstalled operator takes the cluster over: it stays Ready, and deleting it now runs the finalizer,
        # which keeps the claims (deletionPolicy Retain, the default).
        await helm_async(*install, home=home)
        installed = True
        await eventually(lambda: ready(client, namespace, "inventory", 1), timeout=120, interval=1)
        await client.delete(POSTGRES_CLUSTER, "inventory", namespace)
        await eventually(lambda: gone(client, namespace, "inventory"), timeout=120, interval=1)
        assert await names(client, PVC, namespace, "inventory") == claims
    finally:
        if installed:
            await helm_async("uninstall", release, *kubeconfig, "--wait", "--timeout", "120s", home=home)


async def absent_pods(client: Client, namespace: str) -> bool:
    return await operator_pods(client, namespace) == []
