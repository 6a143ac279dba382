"""Why an instance never got to report: what its pod and its claim say, as problems with their own reasons.

An instance manager that does not run cannot report anything, so without this a cluster whose image cannot be
pulled sits in ``Provisioning`` saying "pod Pending". Pure: from the pods and claims in the cache (and the time) to
:class:`~kanri.postgres.cluster.problems.Problem`\\ s, which become the ``Degraded`` condition and one Warning Event
each.

- ``ImagePullFailed``: a container waits with ``ErrImagePull``, ``ImagePullBackOff``, ``InvalidImageName``,
  ``ErrImageNeverPull`` or the local node's ``ImageNotMapped`` (at once).
- ``ContainerCannotStart``: a container waits with ``CreateContainerConfigError``, ``CreateContainerError`` or
  ``RunContainerError`` (at once).
- ``CrashLoopBackOff``: a container waits with ``CrashLoopBackOff`` after at least :data:`CRASHES` restarts; the
  message has the exit code, the kubelet's reason and the last log lines of the terminated state's message.
- ``Unschedulable``: ``PodScheduled=False`` with reason ``Unschedulable`` held :data:`UNSCHEDULABLE_GRACE` seconds
  (the scheduler's message).
- ``VolumePending``: a claim still ``Pending`` :data:`PENDING_GRACE` seconds after it could have been bound
  (:func:`_volume_pending`).
- ``VolumeResizeFailed``: a claim's ``ControllerResizeError`` / ``NodeResizeError`` condition, an ``*Infeasible``
  allocated resource status, or ``FileSystemResizePending`` held :data:`RESIZE_GRACE` seconds.

Messages are stable from one pass to the next (no restart counts, no back-off delays): a changed message is a new
Warning Event and a status write. Logs are never fetched; the log lines come from the pod's status only (the
container's ``terminationMessagePolicy: FallbackToLogsOnError`` puts them there).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from kanri.postgres.cluster.problems import Problem, runbook
from kanri.runtime import parse_optional_time

__all__ = ["CRASHES", "PENDING_GRACE", "RESIZE_GRACE", "UNSCHEDULABLE_GRACE", "pod_problems"]

Obj = dict[str, Any]

CRASHES = 2
"""Restarts before a crash loop is a problem: one exit (a restart, a failover) is the kubelet doing its job."""
UNSCHEDULABLE_GRACE = 20.0
"""Seconds a pod stays unschedulable before it is reported (a node briefly not ready is not the user's to fix)."""
PENDING_GRACE = 60.0
"""Seconds a claim may stay unbound once it could be bound (provisioning takes a moment)."""
RESIZE_GRACE = 300.0
"""Seconds a claim may wait for its node to grow the file system."""

_IMAGE = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "ImageNotMapped"})
_CANNOT_START = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
_INFEASIBLE = frozenset({"ControllerResizeInfeasible", "NodeResizeInfeasible"})
_RESIZE_ERRORS = ("ControllerResizeError", "NodeResizeError")
_MAX_TEXT = 400
_LOG_LINES = 5
# The kubelet's back-off message repeats the pull error after a prefix (older kubelets: only the prefix).
_BACK_OFF = re.compile(r'^Back-off pulling image "[^"]*"(: )?(ErrImagePull: )?')


def _short(text: str, limit: int = _MAX_TEXT) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _since(stamp: object, now: datetime) -> float | None:
    """Seconds since an RFC 3339 timestamp (None when there is none or it cannot be read)."""
    if not isinstance(stamp, str):
        return None
    try:
        then = parse_optional_time(stamp)
    except ValueError:
        return None
    return None if then is None else (now - then).total_seconds()


def _condition(obj: Obj, kind: str) -> Obj | None:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return dict(condition)
    return None


def _log_tail(message: str) -> str:
    """The last few non-empty lines of a terminated container's message, on one line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    tail = " | ".join(lines[-_LOG_LINES:])
    return tail if len(tail) <= _MAX_TEXT else "…" + tail[-(_MAX_TEXT - 1) :]


def _container_problem(status: Obj) -> tuple[str, str] | None:
    """(reason, text) for one container status, or None when it is running, starting or merely restarting."""
    waiting = (status.get("state") or {}).get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    message = str(waiting.get("message") or "")
    name = status.get("name", "?")
    image = status.get("image") or "?"
    if reason in _IMAGE:
        detail = _BACK_OFF.sub("", message) if reason == "ImagePullBackOff" else message
        because = f": {_short(detail)}" if detail.strip() else ""
        return "ImagePullFailed", f"image {image} of container {name} cannot be pulled{because}"
    if reason in _CANNOT_START:
        because = f": {_short(message)}" if message.strip() else f" ({reason})"
        return "ContainerCannotStart", f"container {name} cannot start{because}"
    if reason == "CrashLoopBackOff" and int(status.get("restartCount") or 0) >= CRASHES:
        last = (status.get("lastState") or {}).get("terminated") or {}
        how = [f"exit code {last['exitCode']}" if last.get("exitCode") is not None else "",
               str(last.get("reason") or "")]  # fmt: skip
        ended = f" ({', '.join(h for h in how if h)})" if any(how) else ""
        tail = _log_tail(str(last.get("message") or ""))
        logs = f"; its last log lines: {tail}" if tail else ""
        return "CrashLoopBackOff", f"container {name} keeps exiting{ended}{logs}"
    return None


def _pod_problems(pod: Obj, now: datetime) -> list[tuple[str, str]]:
    if pod["metadata"].get("deletionTimestamp"):
        return []  # going away: its replacement is what counts
    found: list[tuple[str, str]] = []
    status = pod.get("status") or {}
    for container in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]:
        if (problem := _container_problem(container)) is not None:
            found.append(problem)
    scheduled = _condition(pod, "PodScheduled") or {}
    # Only a pod not yet bound to a node: one that has a node or runs was scheduled, whatever an old condition says.
    unbound = not (pod.get("spec") or {}).get("nodeName") and status.get("phase", "Pending") == "Pending"
    if unbound and (scheduled.get("status"), scheduled.get("reason")) == ("False", "Unschedulable"):
        held = _since(scheduled.get("lastTransitionTime"), now)
        if held is None or held >= UNSCHEDULABLE_GRACE:
            why = _short(str(scheduled.get("message") or "")) or "the scheduler gave no message"
            found.append(("Unschedulable", f"its pod cannot be scheduled: {why}"))
    return found


def _volume_pending(claim: Obj, pod: Obj | None, classes: Mapping[str, Obj], now: datetime) -> str | None:
    """Why an unbound claim is a problem, or None while it may still be bound by itself.

    A class that binds ``WaitForFirstConsumer`` provisions only once the pod is scheduled: until then the pod (and
    its ``Unschedulable``) is the cause, and the grace counts from the scheduling. A missing class is
    ``StorageClassNotFound``'s (reported by the reconciler), not repeated here."""
    if (claim.get("status") or {}).get("phase") != "Pending" or claim["metadata"].get("deletionTimestamp"):
        return None
    class_name = (claim.get("spec") or {}).get("storageClassName")
    storage_class = classes.get(class_name) if class_name else None
    if class_name and storage_class is None:
        return None
    waits = (storage_class or {}).get("volumeBindingMode") == "WaitForFirstConsumer"
    if waits:
        scheduled = _condition(pod, "PodScheduled") if pod is not None else None
        if pod is None or scheduled is None or scheduled.get("status") != "True":
            return None
        age = _since(scheduled.get("lastTransitionTime"), now)
    else:
        age = _since(claim["metadata"].get("creationTimestamp"), now)
    if age is not None and age < PENDING_GRACE:
        return None
    name = claim["metadata"]["name"]
    # Without a class name the claim was made while the cluster had no default class (admission fills it in).
    where = f"StorageClass {class_name}" if class_name else "no StorageClass named and no default one"
    node = (claim["metadata"].get("annotations") or {}).get("volume.kubernetes.io/selected-node")
    on = f" on node {node}" if node else ""
    return f"PersistentVolumeClaim {name} ({where}) is still Pending: no volume was provisioned or bound for it{on}"


def _resize_problem(claim: Obj, now: datetime) -> str | None:
    name = claim["metadata"]["name"]
    status = claim.get("status") or {}
    for kind in _RESIZE_ERRORS:
        condition = _condition(claim, kind)
        if condition is not None and condition.get("status") == "True":
            why = _short(str(condition.get("message") or "")) or "no message"
            return f"PersistentVolumeClaim {name} could not be expanded ({kind}): {why}"
    infeasible = (status.get("allocatedResourceStatuses") or {}).get("storage")
    if infeasible in _INFEASIBLE:
        return f"PersistentVolumeClaim {name} cannot be expanded to its request ({infeasible})"
    pending = _condition(claim, "FileSystemResizePending")
    if pending is not None and pending.get("status") == "True":
        held = _since(pending.get("lastTransitionTime"), now)
        if held is not None and held >= RESIZE_GRACE:
            return (f"PersistentVolumeClaim {name}: the volume grew but its node has not grown the file system "
                    f"(FileSystemResizePending for more than {RESIZE_GRACE / 60:g} minutes)")  # fmt: skip
    return None


def _grouped(found: Iterable[tuple[str, str, str]]) -> list[Problem]:
    """One problem per (reason, text), naming every instance it was seen on, with its runbook."""
    groups: dict[tuple[str, str], list[str]] = {}
    for instance, reason, text in found:
        instances = groups.setdefault((reason, text), [])
        if instance not in instances:
            instances.append(instance)
    problems: list[Problem] = []
    for (reason, text), instances in groups.items():
        who = f"instance {instances[0]}" if len(instances) == 1 else f"instances {', '.join(instances)}"
        problems.append(Problem(reason, f"{who}: {text} (runbook {runbook(reason)})"))
    return problems


def pod_problems(
    pods: Mapping[str, Obj],
    claims: Mapping[str, Obj],
    now: datetime,
    *,
    storage_classes: Mapping[str, Obj] | None = None,
) -> list[Problem]:
    """The problems the instances' pods and claims show (instance name -> pod, claim name -> claim; a claim is named
    after its instance). ``storage_classes``: name -> StorageClass, from the cache. ``now`` is timezone-aware."""
    classes = storage_classes or {}
    found: list[tuple[str, str, str]] = []
    for instance in sorted(set(pods) | set(claims)):
        pod = pods.get(instance)
        if pod is not None:
            found += [(instance, reason, text) for reason, text in _pod_problems(pod, now)]
        claim = claims.get(instance)
        if claim is None:
            continue
        if (pending := _volume_pending(claim, pod, classes, now)) is not None:
            found.append((instance, "VolumePending", pending))
        if (resize := _resize_problem(claim, now)) is not None:
            found.append((instance, "VolumeResizeFailed", resize))
    return _grouped(found)
