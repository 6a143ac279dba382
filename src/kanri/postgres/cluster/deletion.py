"""What deleting a PostgresCluster does to its data (the finalizer ``kanri.dev/cleanup``).

Children with an owner reference (StatefulSets, Services, ConfigMap, RBAC, budgets) go with the cluster through
garbage collection either way. The data does not have one — volumes and credentials — so its fate is decided here,
by ``spec.deletionPolicy`` as it is when the object is deleted:

- ``Retain`` (default): claims and Secrets stay; an Event names them. A new PostgresCluster of the same name finds
  them by name and label and adopts them: same data, same passwords.
- ``Delete``: the StatefulSets are deleted first (so the pods go and the claims' protection lets them go), then the
  claims and the Secrets. The finalizer is removed once the deletes are *accepted*: a claim stays until its pod is
  gone, and waiting for that here would only delay the garbage collector that removes the pod.
  The operator's one-shot pods (a restore rehearsal, an upgrade check, an upgrade: :mod:`kanri.postgres.pods.oneshot`)
  are deleted too, when trusted: the garbage collector would take them only once the cluster is gone, and the
  backups' deletion waits for every pod of the cluster first — a rehearsal started by the first backup and still
  running at the deletion held the finalizer until its deadline.
"""

from __future__ import annotations

from typing import Any

from kanri.postgres import names
from kanri.postgres.labels import foreign, of_cluster
from kanri.postgres.pods import oneshot
from kanri.runtime import Cache, Client, EventRecorder
from kanri.runtime.kinds import POD, PVC, SECRET, STATEFUL_SET

__all__ = ["FINALIZER", "cleanup", "data_of", "one_shot_pods_of"]

Obj = dict[str, Any]
FINALIZER = "kanri.dev/cleanup"


def data_of(cache: Cache, cluster: Obj) -> tuple[list[str], list[str]]:
    """Names of the cluster's claims and credential Secrets present in the cache."""
    meta = cluster["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    # by cluster label and app name: another operator's claims of a cluster of the same name are never counted
    claims = sorted(c["metadata"]["name"] for c in of_cluster(cache, PVC, namespace, name))
    # the credentials, then TLS (kanri.postgres.tls.certificates): a retained CA keeps a recreated cluster's clients
    # trusting it
    wanted = [names.superuser_secret(name), names.replication_secret(name), names.app_secret(name),
              names.api_secret(name), names.ca_secret(name), names.ca_key_secret(name),
              names.server_secret(name)]  # fmt: skip
    # by name (a user may bring credentials without labels), but never one another application's label claims
    secrets = [s for s in wanted if (found := cache.get(SECRET, s, namespace)) is not None and not foreign(found)]
    return claims, secrets


def one_shot_pods_of(cache: Cache, cluster: Obj) -> list[str]:
    """Names of the one-shot pods in the cache that the operator made for ``cluster`` (:func:`oneshot.trusted`): a pod
    someone else made under such a name is never deleted."""
    meta, status = cluster["metadata"], cluster.get("status") or {}
    found = ((name, cache.get(POD, name, meta["namespace"])) for name in oneshot.purposes(meta["name"]))
    return [name for name, pod in found if pod is not None and oneshot.trusted(pod, cluster, status)]


async def cleanup(client: Client, cache: Cache, events: EventRecorder, cluster: Obj) -> None:
    """Carry out ``deletionPolicy`` for a cluster being deleted. Idempotent: deleting what is gone is a no-op."""
    meta = cluster["metadata"]
    namespace = meta["namespace"]
    policy = (cluster.get("spec") or {}).get("deletionPolicy") or "Retain"
    claims, secrets = data_of(cache, cluster)
    if policy == "Delete":
        for sts in cache.owned_by(STATEFUL_SET, meta["uid"]):
            await client.delete(STATEFUL_SET, sts["metadata"]["name"], namespace, propagation_policy="Background")
        pods = one_shot_pods_of(cache, cluster)
        for pod in pods:
            await client.delete(POD, pod, namespace)
        for claim in claims:
            await client.delete(PVC, claim, namespace)
        for secret in secrets:
            await client.delete(SECRET, secret, namespace)
        await events.normal(cluster, "DataDeleted", f"deletionPolicy Delete: deleted PersistentVolumeClaims "
                            f"{_list(claims)} and Secrets {_list(secrets)}; stopped {_list(pods)}")  # fmt: skip
        return
    for secret in secrets:
        await _release(client, cache.get(SECRET, secret, namespace), meta["uid"])
    kept = f"kept PersistentVolumeClaims {_list(claims)} and Secrets {_list(secrets)}"
    await events.normal(cluster, "DataRetained", f"deletionPolicy Retain: {kept}; a new PostgresCluster named "
                        f"{meta['name']} adopts them")  # fmt: skip


async def _release(client: Client, secret: Obj | None, owner_uid: str) -> None:
    """Drop an owner reference to the cluster from a Secret (the operator sets none; one added by hand would let
    the garbage collector delete the credentials of retained data)."""
    if secret is None:
        return
    refs = secret["metadata"].get("ownerReferences") or []
    kept = [ref for ref in refs if ref.get("uid") != owner_uid]
    if len(kept) != len(refs):
        body = {"metadata": {"ownerReferences": kept or None, "resourceVersion": secret["metadata"]["resourceVersion"]}}
        await client.patch(SECRET, secret["metadata"]["name"], body, secret["metadata"]["namespace"])


def _list(items: list[str]) -> str:
    return ", ".join(items) if items else "(none)"
