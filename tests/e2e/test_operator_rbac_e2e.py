"""Least privilege, proven (issue 16): the operator installed by the chart runs as a pod under its own
ServiceAccount and does all of its work with no more rights than the chart grants — in namespaced mode, with the
platform's default backup repository (``backup.defaultRepository``: a SeaweedFS object store deployed in the test's
namespace, its key Secret in the release namespace):

- create a cluster with ``backup: {retentionDays: 14}``, scale it 1→2;
- backup: the first base backup (``<cluster>-initial``) Completed, ``status.backup.lastSuccessful`` set and
  ``ContinuousArchiving=True`` (the WAL is in the bucket);
- failover: every process of the primary's pod frozen (its cgroup v1 freezer; the operator's pod runs on the same
  node, so the node itself is left alone): the replica is promoted (``status.lastFailover.from`` the old primary,
  ``status.currentPrimary`` the other instance), a write through ``-rw`` succeeds; thawed, the old primary rejoins
  as a replica and both instances hold every row;
- delete (deletionPolicy Delete): the claims, the Secrets and the cluster's objects in the bucket go.

A missing right would leave a step short of done (a Forbidden write becomes a condition or a log line, not a
success); the operator's log is printed when a step does not finish, and must hold no Forbidden at the end. Then
the real ``kubectl auth can-i --as`` shows that identity is denied everything it must never do. The allowed checks
next to the denials prove the identity is the operator's, not an unknown one that would be denied everything."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.local.seaweedfs import backup_tools_bin
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import EVENT, POD, PVC, ROLE_BINDING, SECRET, SERVICE_ACCOUNT
from tests.e2e.postgres_helpers import (
    cluster,
    deleted,
    every_instance_has,
    names,
    ready,
    ready_with_row,
    write_row,
)
from tests.e2e.test_backup_archiving_e2e import archiving, start_store
from tests.e2e.test_base_backup_e2e import phase_is
from tests.helm_support import CHART, helm_async
from tests.support import eventually

Obj = dict[str, Any]
KUBECTL = Path(sys.executable).parent / "kubectl"
FREEZER = Path("/sys/fs/cgroup/freezer")
NAME = "stock"

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


async def operator_log(control_plane: Endpoint, namespace: str) -> str:
    """The in-cluster operator's log (``kubectl logs`` of the chart's pod)."""
    process = await asyncio.create_subprocess_exec(
        str(KUBECTL), f"--kubeconfig={control_plane.kubeconfig}", "-n", namespace, "logs",
        "-l", "app.kubernetes.io/name=kanri-operator", "--tail=-1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(process.communicate(), 20)
    except TimeoutError:
        process.kill()
        await process.wait()
        return "(kubectl logs did not answer in 20 s)"
    return out.decode(errors="replace")


def forbidden(log: str) -> list[str]:
    return [line for line in log.splitlines() if "forbidden" in line.lower()]


def pod_freezer(uid: str) -> Path | None:
    """The pod's directory in the cgroup v1 freezer hierarchy (``…/kanri/<node>/pod<uid>``, see
    kanri.local.node.cgroups); its containers' cgroups are below it, so freezing it freezes every process of the pod."""
    wanted = f"pod{uid}"
    for root, dirs, _ in os.walk(FREEZER):
        if wanted in dirs:
            return Path(root) / wanted
    return None


@contextlib.asynccontextmanager
async def frozen_pod(uid: str) -> AsyncIterator[Path]:
    """Every process of the pod ``uid`` frozen (the kernel says FROZEN) until the block ends, then thawed."""
    directory = await asyncio.to_thread(pod_freezer, uid)
    assert directory is not None, f"no freezer cgroup pod{uid} under {FREEZER}"
    state = directory / "freezer.state"
    try:
        state.write_text("FROZEN")

        async def is_frozen() -> bool:
            return state.read_text().strip() == "FROZEN"

        await eventually(is_frozen, timeout=10, interval=0.05)
        yield directory
    finally:
        with contextlib.suppress(FileNotFoundError):  # gone with the pod: nothing left to thaw
            state.write_text("THAWED")


async def failed_over_from(client: Client, namespace: str, old: str) -> Obj | None:
    status = (await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {}
    record = status.get("lastFailover") or {}
    primary = status.get("currentPrimary")
    if record.get("from") == old and primary == record.get("to") and primary != old and not status.get("failover"):
        return dict(record)
    return None


async def event_reasons(client: Client, namespace: str, wanted: set[str]) -> set[str] | None:
    """The reasons of the cluster's Events, once every one of ``wanted`` is among them."""
    events, _ = await client.list(EVENT, namespace)
    reasons = {str(e.get("reason")) for e in events if (e.get("involvedObject") or {}).get("name") == NAME}
    return reasons if wanted <= reasons else None


async def last_successful_backup(client: Client, namespace: str) -> str | None:
    status = (await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {}
    return (status.get("backup") or {}).get("lastSuccessful")


@pytest.mark.timeout(600)
@pytest.mark.faults
@pytest.mark.skipif(
    not (backup_tools_bin() / "barman-cloud-backup").exists() or not (backup_tools_bin() / "weed").exists(),
    reason="no backup tools (make backup-tools)",
)
async def test_the_operator_works_under_its_service_account_and_is_denied_what_it_must_never_do(
    client: Client, node: LocalNode, control_plane: Endpoint, namespace: str, tmp_path: Path
) -> None:
    release = f"kanri-{secrets.token_hex(3)}"
    identity = f"system:serviceaccount:{namespace}:{release}-operator"
    kubeconfig = ["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    home = tmp_path / "helm"
    # The object store first: the chart's default repository names its Service's address and its key Secret, which
    # lives in the release namespace (here the watched one too).
    store = await start_store(client, namespace)
    values = tmp_path / "values.yaml"
    repository = store.repository().model_dump(mode="json", by_alias=True, exclude_none=True)
    values.write_text(yaml.safe_dump({"watchNamespaces": [namespace], "backup": {"defaultRepository": repository}}))
    await helm_async("install", release, str(CHART), *kubeconfig, "--values", str(values),
                     "--wait", "--timeout", "300s", home=home)  # fmt: skip
    prefix = f"e2e/{namespace}/{NAME}/"  # the default repository's folder of this cluster
    try:
        try:
            # Everything below is the in-cluster operator's work under the chart's RBAC; a missing right would leave
            # a step short of done (a Forbidden write becomes a condition, not a success).
            manifest = cluster(NAME, namespace, 1, backup={"retentionDays": 14}, deletionPolicy="Delete")
            await client.create(POSTGRES_CLUSTER, manifest)
            await eventually(lambda: ready(client, namespace, NAME, 1), timeout=180, interval=1)
            await client.patch(POSTGRES_CLUSTER, NAME, {"spec": {"replicas": 2}}, namespace)
            await ready_with_row(client, namespace, NAME, 2, 1)

            # Backup: the first base backup, taken as soon as the cluster was Ready, and WAL archiving.
            initial = await eventually(lambda: phase_is(client, namespace, f"{NAME}-initial", "Completed"),
                                       timeout=240, interval=1)  # fmt: skip
            last = await eventually(lambda: last_successful_backup(client, namespace), timeout=60, interval=1)
            await eventually(lambda: archiving(client, namespace, NAME, "True", "Archiving"), timeout=120, interval=1)
            stored = await store.keys_under(prefix)
            assert any("/base/" in key for key in stored), stored
            assert any("/wals/" in key for key in stored), stored
            print(f"\nfirst base backup {initial['backupId']} Completed on {initial['instance']} "
                  f"(WAL {initial['beginWAL']}..{initial['endWAL']}, {initial['sizeBytes']} bytes); "
                  f"lastSuccessful {last}; {len(stored)} objects under {prefix}")  # fmt: skip

            # Failover: the primary's pod frozen, every process of it; the operator's pod on the same node runs on.
            old = str((await client.get(POSTGRES_CLUSTER, NAME, namespace))["status"]["currentPrimary"])
            pod = await client.get(POD, f"{old}-0", namespace)
            async with frozen_pod(str(pod["metadata"]["uid"])) as frozen:
                frozen_at = time.monotonic()
                record = await eventually(lambda: failed_over_from(client, namespace, old), timeout=120,
                                          interval=0.5)  # fmt: skip
                failed_over_at = time.monotonic()
                await write_row(client, namespace, NAME, 2)  # through -rw: the promoted instance takes writes
                writable_at = time.monotonic()
            thawed_at = time.monotonic()
            assert record["to"] != old
            # Thawed: the old primary rejoins as a replica of the new timeline and gets the row written without it.
            found = await eventually(lambda: ready(client, namespace, NAME, 2), timeout=240, interval=1)
            assert found["status"]["currentPrimary"] == record["to"]
            await eventually(lambda: every_instance_has(client, namespace, NAME, [1, 2]), timeout=120, interval=1)
            reasons = await eventually(lambda: event_reasons(client, namespace, {"FailoverStarted", "FailedOver",
                                                                                  "Rejoined"}), timeout=60)  # fmt: skip
            print(f"froze {frozen.name} ({old}-0): failed over after {failed_over_at - frozen_at:.1f} s, a write "
                  f"through -rw {writable_at - failed_over_at:.1f} s later; thawed, {old} rejoined as a replica "
                  f"with every row {time.monotonic() - thawed_at:.1f} s later; lastFailover {record}; "
                  f"events {sorted(reasons)}")  # fmt: skip

            # Delete (deletionPolicy Delete): claims, Secrets and the cluster's objects in the bucket go.
            await client.delete(POSTGRES_CLUSTER, NAME, namespace)
            await deleted(client, namespace, NAME, timeout=120)
            assert await names(client, PVC, namespace, NAME) == []

            async def no_secrets() -> bool:  # the backup credentials go with the garbage collector, after the cluster
                return await names(client, SECRET, namespace, NAME) == []

            await eventually(no_secrets, timeout=60, interval=1)

            async def bucket_emptied() -> bool:
                return await store.keys_under(prefix) == []

            await eventually(bucket_emptied, timeout=60, interval=1)
        except Exception:
            print(f"\n--- the operator's log ---\n{(await operator_log(control_plane, namespace))[-20000:]}")
            raise
        log = await operator_log(control_plane, namespace)
        assert forbidden(log) == [], "\n".join(forbidden(log))

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


# kanri's kinds for namespace users (issue 33): the chart's ClusterRoles aggregated into admin, edit and view.
ADMIN_MAY = [
    ["create", "postgresclusters.kanri.dev"],
    ["delete", "postgresclusters.kanri.dev"],
    ["create", "postgresbackups.kanri.dev"],
    ["get", "postgresclusters.kanri.dev", "--subresource=status"],
]
VIEW_MAY = [["get", "postgresclusters.kanri.dev"], ["list", "postgresclusters.kanri.dev"],
            ["list", "postgresbackups.kanri.dev"]]  # fmt: skip
VIEW_MAY_NOT = [["create", "postgresclusters.kanri.dev"], ["patch", "postgresclusters.kanri.dev"],
                ["delete", "postgresbackups.kanri.dev"], ["create", "postgresbackups.kanri.dev"]]  # fmt: skip


async def test_namespace_admins_manage_and_viewers_read_kanris_kinds_through_the_built_in_roles(
    client: Client, control_plane: Endpoint, namespace: str, tmp_path: Path
) -> None:
    """A ServiceAccount bound (RoleBinding, this namespace only) to the built-in ``admin`` may create PostgresClusters
    and PostgresBackups here, one bound to ``view`` may only read them, and neither may do anything in another
    namespace. Before the chart shipped its aggregated roles ``admin`` held no right on kanri's kinds."""
    release = f"kanri-{secrets.token_hex(3)}"
    kubeconfig = ["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    home = tmp_path / "helm"
    # Namespaced mode (the control plane is shared); no --wait: only the RBAC objects matter here.
    await helm_async("install", release, str(CHART), *kubeconfig, "--set", f"watchNamespaces={{{namespace}}}",
                     "--set", "replicaCount=0", home=home)  # fmt: skip
    try:
        identities = {}
        for role in ("admin", "view"):
            account = f"tenant-{role}"
            await client.create(SERVICE_ACCOUNT, {"metadata": {"name": account, "namespace": namespace}})
            await client.create(ROLE_BINDING, {
                "metadata": {"name": account, "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
            })  # fmt: skip
            identities[role] = f"system:serviceaccount:{namespace}:{account}"

        # The aggregation controller copies the rules into admin/edit/view asynchronously: wait, with a deadline.
        answers: dict[str, str] = {}

        async def aggregated() -> bool:
            for args in ADMIN_MAY:
                answers[" ".join(args)] = await can_i(control_plane, identities["admin"], *args, "-n", namespace)
            for args in VIEW_MAY:
                answers["view " + " ".join(args)] = await can_i(control_plane, identities["view"], *args,
                                                                "-n", namespace)  # fmt: skip
            return all(answer == "yes" for answer in answers.values())

        try:
            await eventually(aggregated, timeout=60, interval=1)
        except TimeoutError:
            pytest.fail(f"admin/view did not gain kanri's kinds within 60 s; last answers: {answers}")
        for args in VIEW_MAY_NOT:
            assert await can_i(control_plane, identities["view"], *args, "-n", namespace) == "no", args
        for role, identity in identities.items():
            for args in [*ADMIN_MAY, *VIEW_MAY]:
                assert await can_i(control_plane, identity, *args, "-n", "default") == "no", (role, args)
    finally:
        await helm_async("uninstall", release, *kubeconfig, "--wait", "--timeout", "120s", home=home)
