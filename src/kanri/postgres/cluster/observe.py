"""What a pass reads before it changes anything: the cluster's instances (claims and StatefulSets in the cache), their
pods, and what each instance manager reports over HTTP (its state is not something Kubernetes can watch)."""

from __future__ import annotations

from typing import Any, Protocol

from kanri.postgres import names
from kanri.postgres.children.statefulset import bootstrap_role
from kanri.postgres.cluster.instances import InstanceClient, InstanceReport, api_token, gather_reports
from kanri.postgres.context import ClusterStep
from kanri.postgres.labels import PRIMARY, belongs, of_cluster, runs_instance
from kanri.runtime.kinds import POD, PVC, STATEFUL_SET

__all__ = ["bootstrapping_primary", "claims", "existing_instances", "observe"]

Obj = dict[str, Any]


class Pass(ClusterStep, Protocol):
    """What observing needs from the reconcile pass."""

    @property
    def uid(self) -> str: ...

    @property
    def running(self) -> bool: ...

    @property
    def instance_client(self) -> InstanceClient: ...


def existing_instances(step: Pass) -> list[str]:
    """Instances with a volume or a StatefulSet (not being deleted): they hold data or run."""
    claims = of_cluster(step.cache, PVC, step.namespace, step.name)
    sets = step.cache.owned_by(STATEFUL_SET, step.uid)
    found = [o["metadata"]["name"] for o in [*claims, *sets] if not o["metadata"].get("deletionTimestamp")]
    return sorted({n for n in found if names.instance_number(step.name, n) is not None})


def claims(step: Pass) -> dict[str, Obj]:
    """The instances' claims in the cache, by name (those being deleted too: their records still count)."""
    found = of_cluster(step.cache, PVC, step.namespace, step.name)
    return {c["metadata"]["name"]: c for c in found if names.instance_number(step.name, c["metadata"]["name"])}


def bootstrapping_primary(step: Pass) -> str | None:
    """Before any instance has reported (status names no primary): the instance already told to bootstrap as
    primary, if an earlier pass — perhaps of an operator killed midway — created one. Choosing another would
    leave every instance waiting to clone from a primary that never initialises."""
    for sts in step.cache.owned_by(STATEFUL_SET, step.uid):
        if bootstrap_role(sts) == PRIMARY and not sts["metadata"].get("deletionTimestamp"):
            return str(sts["metadata"]["name"])
    return None


async def observe(step: Pass) -> tuple[dict[str, InstanceReport], dict[str, Obj]]:
    """Each existing instance's pod (from the cache) and its instance manager's report (over HTTP)."""
    pods: dict[str, Obj] = {}
    for instance in existing_instances(step):
        pod = step.cache.get(POD, names.pod_name(instance), step.namespace)
        if pod is not None and (belongs(pod, step.name) or runs_instance(step.cache, step.cluster, pod)):
            pods[instance] = pod
    if not step.running:
        return {}, pods
    addresses = {
        instance: ip
        for instance, pod in pods.items()
        if (ip := (pod.get("status") or {}).get("podIP")) and not pod["metadata"].get("deletionTimestamp")
    }
    token = api_token(step.cache, step.namespace, step.name)
    reports = await gather_reports(step.instance_client, addresses, token)  # GET /status needs the API token
    # An address can be reused by another pod: trust a report only from the instance it names.
    return {name: report for name, report in reports.items() if report.name == name}, pods
