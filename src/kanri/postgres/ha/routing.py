"""Who the Services route to: each pod's role label, and a second primary fenced before anything else a pass does.

The ``-rw`` and ``-ro`` Services select pods by ``kanri.dev/role``; the label follows what each instance reports
(:func:`label_pods`). In a split brain the primary that is not kept is labelled ``fenced`` (no Service selects it)
and asked to stop PostgreSQL (:func:`fence_rogues`; the decision is :mod:`kanri.postgres.ha.splitbrain`'s).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

import structlog

from kanri.postgres.cluster.instances import InstanceClient, InstanceReport, api_token
from kanri.postgres.context import ClusterStep
from kanri.postgres.ha.splitbrain import HELP, Verdict
from kanri.postgres.labels import (
    FENCED,
    PRIMARY,
    READS,
    REPLICA,
    ROLE,
    SERVES_READS,
    WITHHOLDS_READS,
    missing_labels,
)
from kanri.postgres.topology.plan import InstancePlan
from kanri.runtime import ApiError, Kind
from kanri.runtime.kinds import POD

__all__ = ["fence_rogues", "held_by_failover", "label_pods"]

Obj = dict[str, Any]
log = structlog.get_logger("kanri.postgres")


class Pass(ClusterStep, Protocol):
    """What routing needs from the reconcile pass."""

    @property
    def instance_client(self) -> InstanceClient: ...

    def rejected(self, kind: Kind, name: str, exc: ApiError) -> None: ...


async def label_pods(
    step: Pass,
    plan: InstancePlan,
    reports: dict[str, InstanceReport],
    pods: dict[str, Obj],
    fenced: set[str],
    withheld: Collection[str] = (),
    held: Collection[str] = (),
) -> None:
    """``kanri.dev/role`` on each pod, from the role its instance reports, so the Services route right.

    ``held``: the instances a failover or switchover under way routes itself (the old primary it fenced, the target
    it labels once promoted); their role label is left alone. Their reports were read at the start of the pass,
    before the step demoted or promoted them: following those would route ``-rw`` back to a primary just demoted
    (then a hot standby refusing every write) until a later pass, next to the new primary once it is labelled.

    Before an instance reports, a pod without the label gets its expected role (the primary the plan chose,
    replicas otherwise): replicas clone from ``-rw``, so the bootstrap primary must be behind it first. A label
    is never flipped without a report saying so — except to ``fenced`` for an instance the split-brain record
    keeps fenced (a recreated pod of it must not be routed to before it reports).

    ``kanri.dev/reads``: ``withheld`` for the replicas in ``withheld`` (:mod:`kanri.postgres.ha.reads`), ``serve``
    for any other that answered; an instance that did not answer keeps its label (a new pod gets ``serve``: it is
    not ready, so routed to by no Service, until it answers).
    """
    for instance, pod in pods.items():
        labels = pod["metadata"].get("labels") or {}
        report = reports.get(instance)
        if report is not None:
            wanted = report.role
        elif instance in fenced:
            wanted = FENCED
        elif ROLE in labels:
            wanted = labels[ROLE]
        else:
            wanted = PRIMARY if instance == plan.primary else REPLICA
        # with the app labels a pod of a StatefulSet made before them lacks: the Services select by them too
        patch = missing_labels(pod, step.name, owned=True)
        if labels.get(ROLE) != wanted and instance not in held:
            patch[ROLE] = wanted
        reads = WITHHOLDS_READS if instance in withheld else SERVES_READS
        if labels.get(READS) != reads and (report is not None or READS not in labels):
            patch[READS] = reads
        if not patch:
            continue
        name = pod["metadata"]["name"]
        try:
            await step.client.patch(POD, name, {"metadata": {"labels": patch}}, step.namespace)
        except ApiError as exc:
            if not exc.not_found:
                step.rejected(POD, name, exc)


def held_by_failover(active: bool, progress: Obj | None) -> set[str]:
    """The instances whose role label a failover or switchover under way owns (its ``from`` and ``target``);
    none when no step is active."""
    if not active or not progress:
        return set()
    return {str(progress[key]) for key in ("from", "target") if progress.get(key)}


async def fence_rogues(step: Pass, verdict: Verdict, pods: dict[str, Obj]) -> None:
    """Split brain: each primary but the kept one is labelled ``fenced`` (neither ``-rw`` nor ``-ro`` selects
    it), then asked to stop PostgreSQL and keep it stopped. Both are repeated each pass until it reports fenced;
    a refusal is logged (the label holds the routing meanwhile)."""
    for held in verdict.held:
        log.warning("an instance reports primary while the recorded primary does not answer; not routed to it "
                    "until both report", cluster=step.name, namespace=step.namespace, instance=held)  # fmt: skip
    if not verdict.split or verdict.kept is None:
        return
    token = api_token(step.cache, step.namespace, step.name)
    for rogue in verdict.fence:
        log.warning("split brain: fencing a second primary", cluster=step.name, namespace=step.namespace,
                    kept=verdict.kept.describe(), fenced=rogue.describe(), kept_by=verdict.kept_by)  # fmt: skip
        pod = pods.get(rogue.name)
        if pod is None:
            continue
        name = pod["metadata"]["name"]
        labels = pod["metadata"].get("labels") or {}
        if labels.get(ROLE) != FENCED:
            try:
                await step.client.patch(POD, name, {"metadata": {"labels": {ROLE: FENCED}}}, step.namespace)
            except ApiError as exc:
                if not exc.not_found:
                    step.rejected(POD, name, exc)
            else:  # label_pods later this pass reads this, not the cache's older copy (no second patch)
                pods[rogue.name] = {**pod, "metadata": {**pod["metadata"], "labels": {**labels, ROLE: FENCED}}}
        address = (pod.get("status") or {}).get("podIP")
        if token is None or not address:
            continue
        reason = f"split brain: {verdict.kept.name} is the primary; {HELP}"
        if not await step.instance_client.fence(address, token, reason):
            log.warning("fencing refused or unanswered; retried next pass", instance=rogue.name)
