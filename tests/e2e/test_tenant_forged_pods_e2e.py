"""The tenant's low blows (issue 33 item 5), played with a namespace-admin identity: a ServiceAccount bound to the
built-in ``admin`` ClusterRole plus a Role for kanri's kinds, in its own namespace only, every write through
``kubectl --as``.

- A forged restore rehearsal: the tenant plants a pod named ``<cluster>-restore-test`` with the cluster's labels,
  the operator's request annotation and even a controller owner reference naming the cluster, which exits 0 with a
  "Succeeded" verdict in its termination message, then asks for a rehearsal. The operator must not record that
  verdict nor delete the pod: it reports ``ForeignPod`` naming it (status and ``kubectl describe``). Once the
  tenant's pod is gone the operator's own rehearsal runs under the name and answers the request.
- A bring-your-own ``<cluster>-server`` Secret whose ``ca.crt`` is not PEM: the cluster shows
  ``InvalidServerSecret`` naming the Secret and the key (status and ``kubectl describe``), no value.

On the code before the fix the first test fails (the forged verdict was recorded as ``lastRestoreTest`` and the pod
deleted within a pass) and so does the second (an ``ssl.SSLError`` ended every pass: no phase, no condition).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.local.seaweedfs import backup_tools_bin
from kanri.postgres import names
from kanri.postgres.children.rehearsal import REHEARSAL, REQUEST
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import cluster_labels
from kanri.postgres.tls import certificates as tls
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import EVENT, POD
from tests.e2e.postgres_helpers import cluster, gone, ready
from tests.e2e.test_backup_archiving_e2e import start_store
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
KUBECTL = Path(sys.executable).parent / "kubectl"
TENANT = "tenant"
FORGED_MESSAGE = "forged by the tenant: nothing was restored"
FORGED = json.dumps({"result": "Succeeded", "durationSeconds": 1, "message": FORGED_MESSAGE})


async def kubectl(control_plane: Endpoint, namespace: str, *args: str, stdin: str | None = None, who: str = "") -> str:
    """``kubectl`` in ``namespace``, as ``who`` (a ``--as`` identity; the admin kubeconfig's own when empty)."""
    identity = [f"--as={who}"] if who else []
    process = await asyncio.create_subprocess_exec(
        str(KUBECTL), f"--kubeconfig={control_plane.kubeconfig}", "-n", namespace, *identity, *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(stdin.encode() if stdin else None), 60)
    assert process.returncode == 0, (args, err.decode())
    return out.decode()


async def tenant(control_plane: Endpoint, namespace: str) -> str:
    """A namespace admin of ``namespace`` (and of kanri's kinds there): its ``--as`` identity."""
    manifests = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TENANT}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": f"{TENANT}-admin"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
         "subjects": [{"kind": "ServiceAccount", "name": TENANT, "namespace": namespace}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": f"{TENANT}-kanri"},
         "rules": [{"apiGroups": ["kanri.dev"], "resources": ["postgresclusters", "postgresbackups"],
                    "verbs": ["*"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": f"{TENANT}-kanri"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{TENANT}-kanri"},
         "subjects": [{"kind": "ServiceAccount", "name": TENANT, "namespace": namespace}]},
    ]  # fmt: skip
    await kubectl(control_plane, namespace, "apply", "-f", "-", stdin=yaml.safe_dump_all(manifests))
    return f"system:serviceaccount:{namespace}:{TENANT}"


def forged_pod(name: str, owner: Obj) -> Obj:
    """The tenant's ``<cluster>-restore-test``: everything a name/label/owner check could look at, and a verdict."""
    meta = owner["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.restore_test_pod(name),
            "labels": {**cluster_labels(name), REHEARSAL: "true"},
            "annotations": {REQUEST: "forged"},
            # anyone who can read the cluster can write this reference: it proves nothing
            "ownerReferences": [
                {
                    "apiVersion": POSTGRES_CLUSTER.api_version,
                    "kind": "PostgresCluster",
                    "name": name,
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 26, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "restore-test",
                    "image": "kanri.dev/postgres:15",
                    "command": ["/bin/sh", "-c", f"printf '%s' '{FORGED}' > /dev/termination-log"],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


async def status_of(client: Client, namespace: str, name: str) -> Obj:
    return dict((await client.get(POSTGRES_CLUSTER, name, namespace)).get("status") or {})


async def degraded_with(client: Client, namespace: str, name: str, reason: str, text: str) -> Obj | None:
    """The Degraded condition once its message carries ``text`` and some problem is ``reason`` (the condition's
    reason is the most serious one); None before. Also fails fast when a forged rehearsal was recorded."""
    status = await status_of(client, namespace, name)
    record = (status.get("backup") or {}).get("lastRestoreTest") or {}
    assert FORGED_MESSAGE not in str(record.get("message")), f"the forged verdict was recorded: {record}"
    condition = get_condition(status.get("conditions") or [], "Degraded") or {}
    events, _ = await client.list(EVENT, namespace)
    told = any(e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == name for e in events)
    if condition.get("status") == "True" and text in str(condition.get("message")) and told:
        return dict(condition)
    return None


async def last(what: Any, description: str, timeout: float, interval: float = 1.0) -> Any:
    """``eventually``, with the last observation in the failure message."""
    seen: list[Any] = []

    async def probe() -> Any:
        found = await what()
        seen[:] = [found]
        return found

    try:
        return await eventually(probe, timeout=timeout, interval=interval)
    except (AssertionError, TimeoutError) as exc:
        raise AssertionError(f"{description}: not within {timeout} s; last seen {seen}") from exc


@pytest.mark.timeout(720)
@pytest.mark.skipif(
    not (backup_tools_bin() / "barman-cloud-backup").exists() or not (backup_tools_bin() / "weed").exists(),
    reason="no backup tools (make backup-tools)",
)
async def test_a_forged_rehearsal_pod_is_never_read_nor_deleted_and_is_named(
    client: Client, control_plane: Endpoint, node: LocalNode, namespace: str
) -> None:
    name = "forged"
    store = await start_store(client, namespace)
    instances = HttpInstanceClient()
    operator = Operator(control_plane, namespace, instances=instances, default_backup_repository=store.repository())
    who = await tenant(control_plane, namespace)
    manifest = cluster(name, namespace, 1, backup={"retentionDays": 1})
    await kubectl(control_plane, namespace, "apply", "-f", "-", stdin=yaml.safe_dump(manifest), who=who)
    pod_name = names.restore_test_pod(name)
    try:
        async with operator.running(refresh=2.0):
            await last(lambda: ready(client, namespace, name, 1), "the cluster Ready", 240)
            owner = await client.get(POSTGRES_CLUSTER, name, namespace)
            await kubectl(control_plane, namespace, "create", "-f", "-", stdin=json.dumps(forged_pod(name, owner)),
                          who=who)  # fmt: skip
            planted = (await client.get(POD, pod_name, namespace))["metadata"]["uid"]

            async def forged_finished() -> str | None:
                phase = str(((await client.get(POD, pod_name, namespace)).get("status") or {}).get("phase"))
                return phase if phase in ("Succeeded", "Failed") else None

            assert await last(forged_finished, "the tenant's pod ended", 120) == "Succeeded"
            await kubectl(control_plane, namespace, "annotate", "postgrescluster", name,
                          "kanri.dev/restore-test=forged", who=who)  # fmt: skip
            # the operator names the pod and neither reads nor deletes it
            condition = await last(lambda: degraded_with(client, namespace, name, "ForeignPod", pod_name),
                                   "Degraded naming the foreign pod", 120)  # fmt: skip
            print(f"\nDegraded: {condition['reason']}: {condition['message']}")
            described = await kubectl(control_plane, namespace, "describe", "postgrescluster", name)
            assert "ForeignPod" in described, described
            # several passes later (refresh 2 s): still not recorded, the pod still the tenant's
            for _ in range(5):
                status = await status_of(client, namespace, name)
                assert "lastRestoreTest" not in (status.get("backup") or {}), status.get("backup")
                assert (await client.get(POD, pod_name, namespace))["metadata"]["uid"] == planted
                await asyncio.sleep(2)

            # once the tenant's pod is gone, the operator's own rehearsal answers the request under the name
            await kubectl(control_plane, namespace, "delete", "pod", pod_name, "--wait=true", who=who)

            async def answered() -> Obj | None:
                status = await status_of(client, namespace, name)
                record = (status.get("backup") or {}).get("lastRestoreTest") or {}
                return dict(record) if record.get("request") == "forged" else None

            record = await last(answered, "the operator's own rehearsal answered the request", 300)
            print(f"the operator's own rehearsal: {record}")
            assert FORGED_MESSAGE not in str(record.get("message")), record
            await last(lambda: gone(client, namespace, pod_name, POD), "the operator's rehearsal pod removed", 60)
    finally:
        await instances.close()


def bad_server_secret(name: str, namespace: str) -> Obj:
    """A ``<cluster>-server`` of the user's own (no managed mark): a good certificate and key, a ``ca.crt`` that is
    not PEM."""
    now = dt.datetime.now(dt.UTC)
    ca = tls.build_ca(name, namespace, now)
    server = tls.build_server(ca, names.read_write_service(name), tls.dns_names(name, namespace, [f"{name}-1"]), now)
    data = {"tls.crt": server.cert, "tls.key": server.key, "ca.crt": f"garbage {secrets.token_hex(8)}".encode()}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": names.server_secret(name)},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}  # fmt: skip


@pytest.mark.timeout(300)
async def test_a_server_secret_with_a_ca_that_is_not_pem_is_named_not_a_crash(
    client: Client, control_plane: Endpoint, operator: Operator, namespace: str
) -> None:
    name = "byo"
    who = await tenant(control_plane, namespace)
    secret = bad_server_secret(name, namespace)
    await kubectl(control_plane, namespace, "apply", "-f", "-", stdin=json.dumps(secret), who=who)
    manifest = cluster(name, namespace, 1)
    await kubectl(control_plane, namespace, "apply", "-f", "-", stdin=yaml.safe_dump(manifest), who=who)
    wanted = f"Secret {names.server_secret(name)} key ca.crt is not a PEM certificate"
    async with operator.running(refresh=2.0):
        condition = await last(lambda: degraded_with(client, namespace, name, "InvalidServerSecret", wanted),
                               "Degraded naming the Secret and its key", 120)  # fmt: skip
        print(f"\nDegraded: {condition['reason']}: {condition['message']}")
        assert condition["reason"] == "InvalidServerSecret", condition
        status = await status_of(client, namespace, name)
        assert status.get("phase"), status
        described = await kubectl(control_plane, namespace, "describe", "postgrescluster", name)
        assert "InvalidServerSecret" in described, described
        assert wanted in described, described
