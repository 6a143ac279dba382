"""The order and the pace of a rolling update: replicas first, the primary last, one instance at a time, each only
once every instance is Ready again — except a replica that serves nothing anyway (its template is what breaks it)."""

from __future__ import annotations

from typing import Any, Protocol

from kanri.postgres import names
from kanri.postgres.cluster.diff import is_subset
from kanri.postgres.context import ClusterStep
from kanri.postgres.topology.plan import InstancePlan
from kanri.runtime import get_condition
from kanri.runtime.kinds import POD, STATEFUL_SET

__all__ = ["broken_replica", "instance_settled", "restarts_pod", "rollout_order", "settled"]

Obj = dict[str, Any]


class Pass(ClusterStep, Protocol):
    """What the rollout's rules read of the reconcile pass."""

    @property
    def running(self) -> bool: ...


def settled(step: Pass, plan: InstancePlan) -> bool:
    """Every instance's StatefulSet has rolled out its current template and its pod is Ready."""
    return all(instance_settled(step, instance) for instance in plan.instances)


def instance_settled(step: Pass, instance: str) -> bool:
    """The instance's StatefulSet has rolled out its current template and its pod is Ready."""
    sts = step.cache.get(STATEFUL_SET, instance, step.namespace)
    pod = step.cache.get(POD, names.pod_name(instance), step.namespace)
    if sts is None or pod is None:
        return False
    status = sts.get("status") or {}
    if status.get("observedGeneration") != sts["metadata"].get("generation"):
        return False
    if status.get("updateRevision") != status.get("currentRevision") or not status.get("readyReplicas"):
        return False
    ready = get_condition((pod.get("status") or {}).get("conditions"), "Ready")
    return ready is not None and ready["status"] == "True"


def broken_replica(step: Pass, plan: InstancePlan, instance: str) -> bool:
    """A replica that serves nothing — its StatefulSet rolled out the template it has, and its pod is not Ready
    with it. Restarting it costs no availability, while waiting for the cluster to settle first would wait
    forever when that template is what breaks it (an image the nodes cannot pull, say): the fix could never
    roll out, the StatefulSet controller's own "forced rollback" trap. The primary is never restarted so."""
    if instance == plan.primary:
        return False
    sts = step.cache.get(STATEFUL_SET, instance, step.namespace)
    pod = step.cache.get(POD, names.pod_name(instance), step.namespace)
    if sts is None or pod is None or pod["metadata"].get("deletionTimestamp"):
        return False
    status = sts.get("status") or {}
    revision = (pod["metadata"].get("labels") or {}).get("controller-revision-hash")
    has_the_template = (
        status.get("observedGeneration") == sts["metadata"].get("generation")
        and revision is not None
        and revision == status.get("updateRevision")
    )
    return has_the_template and not instance_settled(step, instance)


def rollout_order(step: Pass, plan: InstancePlan) -> list[str]:
    """Replicas first and the primary last once it exists (a template change restarts the primary once, after
    its replicas); a primary yet to be created comes first — replicas clone from it."""
    primary = plan.primary
    if primary is None or step.cache.get(STATEFUL_SET, primary, step.namespace) is None:
        return [i for i in plan.instances if i == primary] + [i for i in plan.instances if i != primary]
    return [i for i in plan.instances if i != primary] + [i for i in plan.instances if i == primary]


def restarts_pod(step: Pass, current: Obj | None, desired: Obj) -> bool:
    """Whether applying ``desired`` would replace a running pod (its template changes while it runs)."""
    if current is None or not step.running or int((current.get("spec") or {}).get("replicas", 0)) == 0:
        return False
    return not is_subset(desired["spec"]["template"], (current.get("spec") or {}).get("template"))
