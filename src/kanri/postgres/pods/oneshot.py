"""One-shot pods the operator creates under fixed names, and how it tells them from a pod someone else made.

The restore rehearsal (``<cluster>-restore-test``), the upgrade check (``<cluster>-upgrade-check``) and the upgrade
(``<cluster>-upgrade``) run once in a pod whose verdict the operator reads from the termination message and which
it then deletes. Anyone who may create pods in the namespace may create a pod of that name, with the cluster's
labels and even an owner reference naming the cluster (the API server accepts a controller reference from any
writer who can read the owner's uid). So neither name, label nor owner reference is proof:

- when the operator creates such a pod it records the uid the API server gave it in ``status.oneShotPods`` (name ->
  uid; only the operator writes status);
- a pod is **trusted** (:func:`trusted`) only when its uid is the recorded one *and* its controller reference is the
  cluster (same uid);
- any other pod of such a name is **foreign** (:func:`foreign_problems`): never read, never deleted, and reported
  as ``ForeignPod`` (the Degraded condition and a Warning Event) naming it. The step that wants the name waits until
  the pod is gone: the names stay fixed, so a rehearsal or an upgrade can always be found by them.

An operator stopped between creating a pod and recording its uid (one API round trip) must still know the pod as its
own (an e2e kills operators exactly there: a major upgrade waited forever on its own pod). So before creating, the
operator records ``pending:<hash>`` for the name, where the hash is of a random nonce the pod carries in the
annotation ``kanri.dev/one-shot-nonce``; a pod under a pending record is trusted when its nonce hashes to it (and its
controller is the cluster). Status shows only the hash, so no one can forge the pod before it exists; the record
becomes the uid right after the create.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any, Protocol

from kanri.postgres import names
from kanri.postgres.cluster.problems import Problem
from kanri.postgres.context import ClusterStep
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, controller_of
from kanri.runtime.kinds import POD

__all__ = [
    "FIELD",
    "NONCE_ANNOTATION",
    "PENDING",
    "REASON",
    "create",
    "foreign_in",
    "foreign_problems",
    "forget",
    "nonce_hash",
    "purposes",
    "recorded",
    "trusted",
]

Obj = dict[str, Any]
FIELD = "oneShotPods"
"""``status.oneShotPods``: pod name -> uid of each one-shot pod the operator created and has not seen gone."""
REASON = "ForeignPod"
NONCE_ANNOTATION = "kanri.dev/one-shot-nonce"
"""The random nonce a one-shot pod carries; status holds only its hash while the create is under way."""
PENDING = "pending:"


class Pass(ClusterStep, Protocol):
    """What the executor needs from the reconcile pass (a write it refuses becomes the pass's problem)."""

    def rejected(self, kind: Any, name: str, exc: ApiError) -> None: ...


def purposes(cluster: str) -> dict[str, str]:
    """Each one-shot pod's name -> what it is for (as the ForeignPod message says it)."""
    return {
        names.restore_test_pod(cluster): "the restore rehearsal",
        names.upgrade_check_pod(cluster): "the major upgrade's check",
        names.upgrade_pod(cluster): "the major upgrade",
    }


def recorded(status: Obj, name: str) -> str | None:
    """The uid recorded for the pod ``name``, or None."""
    value = (status.get(FIELD) or {}).get(name)
    return str(value) if value else None


def nonce_hash(nonce: str) -> str:
    """What status records for a pod being created with ``nonce`` (fits the record's 64 characters)."""
    return PENDING + hashlib.sha256(nonce.encode()).hexdigest()[:32]


def trusted(pod: Obj, cluster: Obj, status: Obj) -> bool:
    """The operator created ``pod`` for ``cluster``: its uid is the one recorded in status — or, while the record is
    still pending, its nonce hashes to the record — and its controller reference is the cluster itself (see the
    module docstring)."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    ref = controller_of(pod) or {}
    record = recorded(status, str(meta.get("name")))
    if record is not None and record.startswith(PENDING):
        nonce = (meta.get("annotations") or {}).get(NONCE_ANNOTATION)
        ours = isinstance(nonce, str) and secrets.compare_digest(nonce_hash(nonce), record)
    else:
        ours = bool(uid) and uid == record
    return ours and ref.get("kind") == POSTGRES_CLUSTER.kind and ref.get("uid") == cluster["metadata"].get("uid")


def foreign_problems(pods: dict[str, Obj | None], cluster: Obj, status: Obj) -> list[Problem]:
    """A ``ForeignPod`` problem for each one-shot pod name held by a pod the operator did not create (``pods``:
    name -> the pod in the cache, or None). A pod being deleted is going anyway: not reported."""
    found: list[Problem] = []
    for name, purpose in purposes(cluster["metadata"]["name"]).items():
        pod = pods.get(name)
        if pod is None or pod["metadata"].get("deletionTimestamp") or trusted(pod, cluster, status):
            continue
        found.append(
            Problem(
                REASON,
                f"Pod {name} was not created by the operator for this cluster (its uid is not the one recorded in "
                f"status.oneShotPods): it is neither read nor deleted, and {purpose} waits until it is gone",
            )
        )
    return found


# --- executor ----------------------------------------------------------------------------------------------------


def foreign_in(step: Pass) -> list[Problem]:
    """:func:`foreign_problems` of the pass's cluster, from the cache (costs no request)."""
    pods = {name: step.cache.get(POD, name, step.namespace) for name in purposes(step.name)}
    return foreign_problems(pods, step.cluster, step.status)


async def _record(step: Pass, name: str, uid: str | None) -> None:
    patch = {"status": {FIELD: {name: uid}}}
    updated = await step.client.patch_status(POSTGRES_CLUSTER, step.name, patch, step.namespace)
    step.adopt_status(updated)


async def create(step: Pass, pod: Obj) -> bool:
    """Create the one-shot ``pod`` and record its uid in status (True: created now). A 409 is a pod of that name
    already there: ours when its uid is recorded (the cache has not seen it yet), else a foreign one the pass
    reports once the cache has it."""
    name = pod["metadata"]["name"]
    record = recorded(step.status, name)
    nonce: str | None = None
    if record is None or record.startswith(PENDING):  # a recorded uid: a pod of ours the cache may not show yet
        nonce = secrets.token_hex(16)
        meta = pod["metadata"]
        pod = {**pod, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}), NONCE_ANNOTATION: nonce}}}
        await _record(step, name, nonce_hash(nonce))  # before the create: a kill after it leaves a pod still ours
    try:
        made = await step.client.create(POD, pod)
    except ApiError as exc:
        if exc.status != 409:
            step.rejected(POD, name, exc)
        if nonce is not None:
            await _record(step, name, None)  # nothing of ours was made (a 409: the name is someone else's pod)
        return False
    await _record(step, name, str(made["metadata"]["uid"]))
    return True


async def forget(step: Pass, name: str) -> None:
    """Drop the record of ``name`` once its pod is gone (no write when none is recorded)."""
    if recorded(step.status, name) is not None:
        await _record(step, name, None)
