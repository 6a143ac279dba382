"""A running PostgresCluster through the operator upgrade that changes the storage version (issue 28, "Done means").

Release N serves v1alpha1 alone (the CRDs the session installs); a cluster is created through it and written to.
Release N+1 (``kanri.postgres.api.conversion.POSTGRES``: v1beta1 stored, v1alpha1 served through the operator's
conversion webhook) then takes over: it brings its two-version CRDs, its leader's migration rewrites the stored
objects and prunes ``storedVersions`` to ``["v1beta1"]``. The cluster's PostgreSQL is never restarted, the cluster
reads and writes in both versions, stays Ready and keeps its data, and the manifest exported in v1alpha1 before the
upgrade (the seed's "backup of existing CRs") re-applies with ``kubectl apply`` without changing anything.

Afterwards this release's operator migrates the objects back to v1alpha1 and the CRDs are put back to v1alpha1
alone, as the other modules of the session expect them.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.postgres.api import v1alpha1
from kanri.postgres.api.conversion import POSTGRES
from kanri.postgres.api.served import SERVED
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.runtime import Client, Kind, WebhookOptions
from kanri.runtime.kinds import CRD
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
from tests.postgres_support import Operator, VersionedRelease, put_back_single_version_crds
from tests.support import eventually

OLD = v1alpha1.PostgresCluster.resource.api_kind
NEW = Kind("kanri.dev/v1beta1", "PostgresCluster", "postgresclusters")
NAME = "orders"
# What the API server owns in an exported manifest: `kubectl get -o yaml` minus these re-applies as the user wrote it.
SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def release(namespace: str, port: int, versions: Any) -> VersionedRelease:
    webhook = WebhookOptions(namespace=namespace, secret="kanri-webhook", url=f"https://127.0.0.1:{port}/convert",
                             host="127.0.0.1", port=port, check_interval=2.0)  # fmt: skip
    return VersionedRelease(webhook, versions)


async def stored_in(client: Client, version: str) -> list[str] | None:
    """Both CRDs' ``storedVersions`` once they are ``[version]``."""
    found = []
    for model in (v1alpha1.PostgresCluster, v1alpha1.PostgresBackup):
        stored = (await client.get(CRD, model.resource.crd_name)).get("status", {}).get("storedVersions")
        if stored != [version]:
            return None
        found.append(model.resource.crd_name)
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


@pytest.mark.timeout(480)
async def test_a_running_cluster_keeps_its_postgresql_through_the_upgrade_to_v1beta1_storage(
    client: Client, node: LocalNode, control_plane: Endpoint, namespace: str, tmp_path: Path
) -> None:
    kubeconfig, cache = control_plane.kubeconfig, tmp_path / "kube-cache"
    instances = HttpInstanceClient()
    port = _free_port()
    try:
        # Release N: v1alpha1 alone.
        before = Operator(control_plane, namespace, instances=instances)
        async with before.running(refresh=10.0):
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

        # Release N+1: v1beta1 stored. Its leader migrates; nothing restarts.
        after = Operator(control_plane, namespace, instances=instances, versions=release(namespace, port, POSTGRES))
        async with after.running(refresh=10.0):
            await eventually(lambda: stored_in(client, "v1beta1"), timeout=120, interval=1)
            assert await eventually(lambda: ready(client, namespace, NAME, 1), timeout=60, interval=1)
            # read and written with kubectl in both versions, converted by the webhook each way
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
            await write_row(client, namespace, NAME, 2)
            user, password = await credentials(client, namespace, NAME)
            rows = await rows_through(await cluster_ip(client, namespace, f"{NAME}-rw"), user, password)
            assert sorted(rows) == [1, 2]
            assert await eventually(lambda: ready(client, namespace, NAME, 1), timeout=60, interval=1)
            assert await postmaster_start_times(client, namespace, NAME) == started, "an instance restarted"
    finally:
        # Back to v1alpha1 storage (this release's operator migrates back), then the CRDs to v1alpha1 alone.
        back = Operator(control_plane, namespace, instances=instances, versions=release(namespace, port, SERVED))
        async with back.running(refresh=10.0):
            await eventually(lambda: stored_in(client, "v1alpha1"), timeout=120, interval=1)
        await put_back_single_version_crds(client)
        await instances.close()
