"""Problems the user must see: what the operator found wrong this pass, each with a reason and a message.

They become the ``Degraded`` condition (the most serious reason first, every message joined) and one Warning Event
each when they appear (see ``status.py``/``reconciler.py``). Messages name objects, keys and parameters, never a
value from a Secret.

| reason | found by | the user does |
|---|---|---|
| ``SplitBrain`` | the operator: two instances reported primary; the one not recorded was fenced | recover the fenced
instance (docs/postgres-operator.md, "Split brain") |
| ``FailoverBlocked`` | the operator: the primary failed and promoting the best replica could lose more than the
spec allows | approve (``kanri.dev/approve-failover``, docs/postgres-operator.md "Failover") or bring the primary back |
| ``Fenced`` | an instance: it holds a fence marker and keeps PostgreSQL stopped | see SplitBrain |
| ``RejoinFailed`` | a former primary could neither rewind nor re-clone | see its log; delete its claim to re-clone |
| ``DataDirectoryLost`` | an instance: its volume is empty, the cluster has data | replica: nothing (it re-clones);
a primary with replicas: nothing (failed over at once, then re-cloned); a lone primary: restore a backup into a new
cluster |
| ``SystemIdentifierMismatch`` | an instance: its data belongs to another cluster | replace the volume |
| ``DataVersionMismatch`` | an instance: its binaries cannot open its data | nothing (the image is reverted) |
| ``VolumeLost`` | the operator: a running instance's claim was deleted | see DataDirectoryLost |
| ``PostgresUnreachable`` | an instance: its manager cannot connect to its own running PostgreSQL (libpq's first
line: peer authentication, the socket directory, no connection slot left) | docs/runbooks/PostgresUnreachable.md |
| ``DiskFull`` | an instance: PostgreSQL failed to write for lack of space and its data volume is still short of room
(:func:`disk_full`: the instance, its claim, the free bytes) | delete data or grow ``spec.storage.size``
(docs/runbooks/DiskFull.md); the instance starts again by itself |
| ``ChildRejected`` | the API server refused a write of a child | fix what the message names (often a spec field) |
| ``ChildConflict`` | a child's name is taken by an object another owner controls | rename or delete one of them |
| ``ForeignPod`` | the operator: a pod it did not create holds a one-shot pod's name (``kanri.postgres.pods.oneshot``) |
delete that pod |
| ``StorageClassNotFound`` | ``spec.storage.storageClassName`` does not exist | create the class or fix the name |
| ``PriorityClassNotAllowed`` | the operator: ``spec.podTemplate.priorityClassName`` is outside the platform's list
(``kanri.postgres.pods.policy``) | name an allowed class, or none |
| ``InvalidSecret`` | the operator or an instance: a credential Secret is unusable | fix the key named |
| ``InvalidServerSecret``, ``InvalidCASecret`` | the operator: a TLS Secret it reads is unusable
(``kanri.postgres.tls.step``) | fix the key named |
| ``OwnerMismatch`` | the adopted ``<cluster>-app`` Secret's user is not ``bootstrap.initdb.owner`` | align them |
| ``InvalidParameter`` | an instance: PostgreSQL refused a parameter | fix ``spec.postgresql.parameters`` |
| ``InvalidConfig``, ``InstanceProblem`` | an instance | see its message |
| ``ImagePullFailed`` | the operator, from a pod: its image cannot be pulled (or is not mapped on the local node) | fix
``spec.version`` or make the image available (docs/runbooks/ImagePullFailed.md) |
| ``ContainerCannotStart`` | the operator, from a pod: the container cannot be created or started | see its message |
| ``Unschedulable`` | the operator, from a pod: no node fits it | fix ``spec.podTemplate`` or the nodes |
| ``VolumePending`` | the operator, from a claim: it stays unbound | fix the StorageClass or its provisioner |
| ``VolumeResizeFailed`` | the operator, from a claim: its expansion failed or stays unfinished | see its message |
| ``CrashLoopBackOff`` | the operator, from a pod: its container keeps exiting | see the log lines in the message |
| ``DurabilityReduced`` | the operator, from the primary's ``pg_stat_replication``: with ``dataDurability: preferred``,
fewer replicas stream than ``syncStandbys``, so commits wait for fewer (:mod:`kanri.postgres.ha.durability`) | bring
the replicas back; nothing once they stream again |
| ``ReadsWithheld`` | the operator, from the primary's ``pg_stat_replication``: a ready replica further behind in
replay than ``replication.maxReadLagBytes``, or not streaming | nothing while it catches up; a frozen WAL receiver:
restart that instance's pod |

Each reason has a runbook, ``docs/runbooks/<reason>.md`` (:func:`runbook`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kanri.contract.secrets import Purpose, credential_problems, token_problems
from kanri.postgres import names
from kanri.postgres.cluster.instances import InstanceProblem, InstanceReport
from kanri.runtime import ApiError

__all__ = [
    "RUNBOOKS",
    "SEVERITY",
    "Problem",
    "child_conflict",
    "child_rejected",
    "disk_full",
    "ordered",
    "report_problems",
    "runbook",
    "secret_problems",
    "storage_class_missing",
    "volume_lost",
]

Obj = dict[str, Any]
_MAX_SERVER_MESSAGE = 500

SEVERITY = (
    "SplitBrain",
    "FailoverBlocked",
    "Fenced",
    "RejoinFailed",
    "DataDirectoryLost",
    "SystemIdentifierMismatch",
    "DataVersionMismatch",
    "VolumeLost",
    # The instance runs but its manager is blind: no readiness, roles, slots or status until a human fixes the login.
    "PostgresUnreachable",
    # The instance cannot write (and keeps restarting) until space returns; it recovers by itself after that.
    "DiskFull",
    "ChildRejected",
    "ChildConflict",
    "ForeignPod",
    "StorageClassNotFound",
    "PriorityClassNotAllowed",
    "InvalidSecret",
    "InvalidServerSecret",
    "InvalidCASecret",
    "OwnerMismatch",
    "InvalidParameter",
    "InvalidConfig",
    # Seen on the pods and claims (kanri.postgres.cluster.pod_problems): why an instance never got to report.
    "ImagePullFailed",
    "ContainerCannotStart",
    "Unschedulable",
    "VolumePending",
    "VolumeResizeFailed",
    "CrashLoopBackOff",
    "InstanceProblem",
    # The cluster serves; commits wait for fewer standbys than syncStandbys (dataDurability preferred).
    "DurabilityReduced",
    # The cluster serves; one replica's reads are routed elsewhere until it catches up (kanri.postgres.ha.reads).
    "ReadsWithheld",
)
"""Most serious first: the first problem's reason is the ``Degraded`` condition's reason."""


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str
    event: str | None = None
    """The Warning Event's message when it differs from ``message`` (say, with restore instructions)."""
    subject: tuple[str, str] | None = None
    """For ``InvalidSecret``: (purpose, key), so the instances' reports of the same fault are not repeated."""


RUNBOOKS = "docs/runbooks"
"""Where the runbooks live: one ``<reason>.md`` per reason (a path in the project, as the users' docs cite it)."""


def runbook(reason: str) -> str:
    """The runbook of ``reason``: what it means, how to look, how to recover."""
    return f"{RUNBOOKS}/{reason}.md"


def ordered(problems: Iterable[Problem]) -> list[Problem]:
    """Without duplicates, most serious first (stable within one reason)."""
    unique = list(dict.fromkeys(problems))
    rank = {reason: i for i, reason in enumerate(SEVERITY)}
    return sorted(unique, key=lambda p: rank.get(p.reason, len(SEVERITY)))


def _decoded(secret: Obj) -> dict[str, bytes]:
    data: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            data[key] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            continue
    return data


def secret_problems(cluster: str, secrets: Mapping[str, Obj | None], owner: str) -> list[Problem]:
    """What is wrong with the adopted credential Secrets (name -> object from the cache; None when missing)."""
    purposes: list[tuple[str, Purpose | None]] = [
        (names.superuser_secret(cluster), "superuser"),
        (names.replication_secret(cluster), "replication"),
        (names.app_secret(cluster), "app"),
        (names.api_secret(cluster), None),
    ]
    found: list[Problem] = []
    for name, purpose in purposes:
        secret = secrets.get(name)
        if secret is None:
            continue  # created this pass or the next
        data = _decoded(secret)
        issues = credential_problems(purpose, data) if purpose is not None else token_problems(data)
        for issue in issues:
            found.append(
                Problem(
                    "InvalidSecret",
                    f"Secret {name} key {issue.key} {issue.message}",
                    subject=(purpose or "api", issue.key),
                )
            )
        user = data.get("username", b"").decode(errors="replace").strip()
        if purpose == "app" and not issues and user != owner:
            found.append(
                Problem(
                    "OwnerMismatch",
                    f"Secret {name} (adopted) holds another username than spec.bootstrap.initdb.owner ({owner}): "
                    f"the application role stays the Secret's; set initdb.owner to it or fix the Secret",
                )
            )
    return found


_LOST_HELP = (
    "a replica clones again from the primary by itself; a primary with replicas is failed over at once and cloned "
    "again; if it was the only copy (a lone primary), restore a backup into a new PostgresCluster (runbook "
    "DataDirectoryLost in docs/postgres-operator.md)"
)


def _text(p: InstanceProblem) -> str:
    """An instance problem's message, naming its parameter or Secret key when the message does not already."""
    if p.reason == "InvalidParameter" and p.parameter:
        return f"parameter {p.parameter}: {p.message}"
    if p.reason == "InvalidSecret" and p.secret and not p.message.startswith(f"{p.secret} Secret"):
        key = f" key {p.key}" if p.key else ""
        return f"{p.secret} Secret{key}: {p.message}"
    return p.message


_LINKED = frozenset({"PostgresUnreachable"})
"""Reasons the instances report that have a runbook of their own; their message ends with it."""


def report_problems(reports: Mapping[str, InstanceReport], *, known: Collection[tuple[str, str]] = ()) -> list[Problem]:
    """The problems the instances report, each under its own reason, naming the instances that report it (the same
    fault on every instance is one line). ``known``: (purpose, key) of Secret faults the operator reported itself."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for name in sorted(reports):
        for p in reports[name].problems:
            if p.reason == "InvalidSecret" and p.secret and (p.secret, p.key or "") in known:
                continue
            grouped.setdefault((p.reason, _text(p)), []).append(name)
    found: list[Problem] = []
    for (reason, text), instances in grouped.items():
        who = f"instance {instances[0]}" if len(instances) == 1 else f"instances {', '.join(instances)}"
        if reason == "DataDirectoryLost":
            message = f"the data of {who} is gone ({text})"
            found.append(Problem(reason, message, f"{message}; {_LOST_HELP}"))
        elif reason == "DiskFull":
            found.extend(disk_full(name, text) for name in instances)
        elif reason in _LINKED:
            found.append(Problem(reason, f"{who}: {text} (runbook {runbook(reason)})"))
        else:
            found.append(Problem(reason, f"{who}: {text}"))
    return found


def disk_full(instance: str, report: str) -> Problem:
    """``DiskFull`` of one instance: its claim (the volume is ``PersistentVolumeClaim <instance>``) and what it
    reported (the free and total bytes, what PostgreSQL could not write), with the way out. One problem per instance:
    each volume fills on its own."""
    message = f"instance {instance}: PersistentVolumeClaim {instance}: {report} (runbook {runbook('DiskFull')})"
    return Problem("DiskFull", message)


def volume_lost(instance: str) -> Problem:
    message = f"PersistentVolumeClaim {instance} of instance {instance} was deleted; its data is gone"
    return Problem("VolumeLost", message, f"{message}; a new empty volume is made: {_LOST_HELP}")


def child_rejected(kind: str, name: str, error: ApiError) -> Problem:
    text = " ".join(error.message.split())[:_MAX_SERVER_MESSAGE] or error.reason or "no message"
    return Problem("ChildRejected", f"the API server refused {kind} {name} ({error.status}): {text}")


def child_conflict(kind: str, name: str, owner: str) -> Problem:
    return Problem("ChildConflict", f"{kind} {name} is controlled by {owner}; it is not taken over")


def storage_class_missing(storage_class: str, claims: list[str]) -> Problem:
    waiting = f"; claims waiting: {', '.join(claims)}" if claims else ""
    return Problem(
        "StorageClassNotFound",
        f"StorageClass {storage_class} (spec.storage.storageClassName) does not exist{waiting}",
    )
