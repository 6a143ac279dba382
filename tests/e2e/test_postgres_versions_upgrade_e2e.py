"""A running PostgresCluster through both steps of the API version change, by `helm upgrade` alone (issue 28).

The chart's operator runs as a pod of the local node, and every step is a `helm upgrade --reuse-values` whose new
operator pod brings the CRDs it serves before it acts (docs/helm.md, "Serving v1beta1"):

1. release N: the webhook off, v1alpha1 alone. A cluster is created through it and written to, and its manifest is
   exported in v1alpha1 (the seed's "backup of existing CRs").
2. ``conversionWebhook.enabled=true``: the CRDs serve v1beta1 beside v1alpha1 (still stored), the API server converts
   through the webhook's Service to the pod, and the pod is ready only once it did.
3. ``conversionWebhook.storageVersion=v1beta1``: the leader's storage migration rewrites every object and prunes
   ``storedVersions`` to ``["v1beta1"]``; the cluster reads and writes with kubectl in both versions, the exported
   manifest re-applies without changing the spec, a row is written.
4. turning the webhook off now is refused by the new pod with a message saying what to do, and the CRDs are left as
   they are; the old pod keeps running (the rollout never completes).
5. ``storageVersion=v1alpha1``: every object migrated back, ``storedVersions`` ``["v1alpha1"]``.
6. the webhook off: the CRDs serve v1alpha1 alone again, no conversion configured.

Throughout, the cluster's PostgreSQL is never restarted and stays Ready with every row it was given.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path

import pytest
import yaml

from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.postgres.api import v1alpha1
from kanri.postgres.versions import STORAGE_VERSION_ENV
from kanri.runtime import Client, Kind
from kanri.runtime.kinds import CRD, POD
from tests.e2e.postgres_helpers import (
    cluster,
    cluster_ip,
    credentials,
    postmaster_start_times,
    ready,
    ready_with_row,
    rows_through,
    write_row,
)
from tests.helm_support import CHART, helm_async, pod_log_tails
from tests.postgres_support import put_back_single_version_crds
from tests.support import eventually

OLD = v1alpha1.PostgresCluster.resource.api_kind
NEW = Kind("kanri.dev/v1beta1", "PostgresCluster", "postgresclusters")
OLD_BACKUP = v1alpha1.PostgresBackup.resource.api_kind
NEW_BACKUP = Kind("kanri.dev/v1beta1", "PostgresBackup", "postgresbackups")
CRDS = (v1alpha1.PostgresCluster.resource.crd_name, v1alpha1.PostgresBackup.resource.crd_name)
NAME = "orders"
# What the API server owns in an exported manifest: `kubectl get -o yaml` minus these re-applies as the user wrote it.
SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields")


async def stored_in(client: Client, version: str) -> list[str] | None:
    """Both CRDs' ``storedVersions`` once they are ``[version]``."""
    for name in CRDS:
        stored = (await client.get(CRD, name)).get("status", {}).get("storedVersions")
        if stored != [version]:
            return None
    return list(CRDS)


async def served(client: Client) -> list[tuple[list[str], str | None, str]]:
    """Per CRD: the versions it serves, the storage version and the conversion strategy."""
    found = []
    for name in CRDS:
        spec = (await client.get(CRD, name))["spec"]
        versions = spec["versions"]
        storage = next((v["name"] for v in versions if v.get("storage")), None)
        found.append((sorted(v["name"] for v in versions if v.get("served")), storage, spec["conversion"]["strategy"]))
    return found


async def kubectl(kubeconfig: Path, cache: Path, *args: str) -> str:
    """kubectl with a discovery cache of its own: the shared one (~/.kube/cache) would remember v1beta1 as the
    group's preferred version after the CRDs are put back to v1alpha1 alone, and every later kubectl call of the
    session on PostgresClusters would ask for v1beta1 (404)."""
    process = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
    return out.decode()


@pytest.mark.timeout(900)
async def test_helm_upgrades_take_a_running_cluster_to_v1beta1_storage_and_back(
    client: Client, node: LocalNode, control_plane: Endpoint, namespace: str, tmp_path: Path
) -> None:
    kubeconfig, cache = control_plane.kubeconfig, tmp_path / "kube-cache"
    release = f"kanri-{secrets.token_hex(3)}"
    operator = f"{release}-operator"
    on_kubeconfig = ["--kubeconfig", str(kubeconfig), "--namespace", namespace]
    home = tmp_path / "helm"

    async def upgrade(*values: str, wait: bool = True) -> None:
        sets = [arg for value in values for arg in ("--set", value)]
        waiting = ["--wait", "--timeout", "180s"] if wait else []
        await helm_async("upgrade", release, str(CHART), *on_kubeconfig, "--reuse-values", *sets, *waiting, home=home)

    async def unchanged_postgres() -> None:
        assert await eventually(lambda: ready(client, namespace, NAME, 1), timeout=120, interval=1)
        assert await postmaster_start_times(client, namespace, NAME) == started, "an instance restarted"

    installed = False
    try:
        # 1. Release N: v1alpha1 alone.
        await helm_async("install", release, str(CHART), *on_kubeconfig, "--set", f"watchNamespaces={{{namespace}}}",
                         "--wait", "--timeout", "300s", home=home)  # fmt: skip
        installed = True
        await client.create(OLD, cluster(NAME, namespace, 1))
        await ready_with_row(client, namespace, NAME, 1, value=1)
        started = await eventually(lambda: postmaster_start_times(client, namespace, NAME), timeout=30)
        resource = f"postgresclusters.v1alpha1.kanri.dev/{NAME}"
        exported = json.loads(await kubectl(kubeconfig, cache, "-n", namespace, "get", resource, "-o", "json"))
        for key in SERVER_FIELDS:
            exported["metadata"].pop(key, None)
        exported.pop("status", None)
        manifest = tmp_path / "orders-v1alpha1.yaml"
        manifest.write_text(yaml.safe_dump(exported))
        # a PostgresBackup too, so that both CRDs have an object to migrate
        await client.create(OLD_BACKUP, {"metadata": {"name": "of-nothing", "namespace": namespace},
                                         "spec": {"cluster": "none"}})  # fmt: skip

        # 2. The webhook on: v1beta1 served, v1alpha1 still stored. --wait returned: the pod converted through its
        # Service (it is unready until then).
        await upgrade("conversionWebhook.enabled=true")
        assert await served(client) == [(["v1alpha1", "v1beta1"], "v1alpha1", "Webhook")] * 2
        crd = await client.get(CRD, CRDS[0])
        service = crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]
        assert (service["name"], service["namespace"]) == (f"{operator}-webhook", namespace)
        assert (await client.get(NEW, NAME, namespace))["apiVersion"] == "kanri.dev/v1beta1"
        assert (await client.get(NEW_BACKUP, "of-nothing", namespace))["spec"]["cluster"] == "none"
        assert await stored_in(client, "v1alpha1")
        serving, _ = await client.list(POD, namespace, label_selector="kanri.dev/conversion-webhook=serving")
        assert len(serving) == 1

        # 3. v1beta1 stored: the leader migrates every object; nothing restarts.
        await upgrade("conversionWebhook.storageVersion=v1beta1")
        await eventually(lambda: stored_in(client, "v1beta1"), timeout=120, interval=1)
        assert await served(client) == [(["v1alpha1", "v1beta1"], "v1beta1", "Webhook")] * 2
        new, old = f"postgresclusters.v1beta1.kanri.dev/{NAME}", resource
        read_new = json.loads(await kubectl(kubeconfig, cache, "-n", namespace, "get", new, "-o", "json"))
        read_old = json.loads(await kubectl(kubeconfig, cache, "-n", namespace, "get", old, "-o", "json"))
        assert read_new["apiVersion"] == "kanri.dev/v1beta1"
        assert read_new["metadata"]["uid"] == read_old["metadata"]["uid"]
        assert read_old["spec"] == exported["spec"], "v1alpha1 -> v1beta1 (stored) -> v1alpha1 changed the spec"
        await kubectl(kubeconfig, cache, "-n", namespace, "label", new, "e2e/written-through=v1beta1")
        await kubectl(kubeconfig, cache, "-n", namespace, "annotate", old, "e2e/written-through=v1alpha1")
        both = await client.get(NEW, NAME, namespace)
        assert both["metadata"]["labels"]["e2e/written-through"] == "v1beta1"
        assert both["metadata"]["annotations"]["e2e/written-through"] == "v1alpha1"
        applied = await kubectl(kubeconfig, cache, "-n", namespace, "apply", "-f", str(manifest))
        assert NAME in applied, applied
        assert (await client.get(OLD, NAME, namespace))["spec"] == exported["spec"]
        await write_row(client, namespace, NAME, 2)
        await unchanged_postgres()

        # 4. The webhook off while objects are stored in v1beta1: the new pod refuses, saying what to do; the CRDs
        # stay as they are.
        await upgrade("conversionWebhook.enabled=false", wait=False)
        refusal = "has objects stored in v1beta1 (status.storedVersions)"

        async def refused() -> str | None:
            tails = await pod_log_tails(tmp_path / "node", "*operator*")
            return tails if refusal in tails else None

        said = await eventually(refused, timeout=120, interval=1)
        assert "conversionWebhook.storageVersion=v1alpha1" in said
        assert await served(client) == [(["v1alpha1", "v1beta1"], "v1beta1", "Webhook")] * 2

        # 5. Back to v1alpha1 storage (with the webhook: the Service comes back), every object migrated back.
        await upgrade("conversionWebhook.enabled=true", "conversionWebhook.storageVersion=v1alpha1")
        await eventually(lambda: stored_in(client, "v1alpha1"), timeout=120, interval=1)
        assert await served(client) == [(["v1alpha1", "v1beta1"], "v1alpha1", "Webhook")] * 2

        # 6. The webhook off: v1alpha1 alone again.
        await upgrade("conversionWebhook.enabled=false")
        assert await served(client) == [(["v1alpha1"], "v1alpha1", "None")] * 2
        await write_row(client, namespace, NAME, 3)
        user, password = await credentials(client, namespace, NAME)
        rows = await rows_through(await cluster_ip(client, namespace, f"{NAME}-rw"), user, password)
        assert sorted(rows) == [1, 2, 3]
        await unchanged_postgres()
        env = await eventually(lambda: operator_env(client, namespace), timeout=60)
        assert STORAGE_VERSION_ENV not in env
    finally:
        print(await pod_log_tails(tmp_path / "node", "*operator*"))
        if installed:
            await helm_async("uninstall", release, *on_kubeconfig, "--wait", "--timeout", "120s", home=home)
        # the session's other modules expect v1alpha1 alone (a failure above may have left the webhook's CRDs)
        if await stored_in(client, "v1alpha1"):
            await put_back_single_version_crds(client)


async def operator_env(client: Client, namespace: str) -> list[str] | None:
    """The env names of the operator's one running pod, once exactly one runs."""
    pods, _ = await client.list(POD, namespace, label_selector="app.kubernetes.io/name=kanri-operator")
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    if len(live) != 1:
        return None
    (container,) = live[0]["spec"]["containers"]
    return [e["name"] for e in container.get("env", [])]
