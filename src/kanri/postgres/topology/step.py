"""Steps that shape a cluster's instances: scale-down (StatefulSet, then volume), disruption budgets, volume growth
and a storage class that does not exist (named, since the pods only say Pending)."""

from __future__ import annotations

from kanri.postgres import names
from kanri.postgres.children.pdb import disruption_budgets, wants_budgets
from kanri.postgres.cluster.problems import storage_class_missing
from kanri.postgres.context import ChildStep as Pass
from kanri.postgres.labels import cluster_routes_by_app
from kanri.postgres.topology.plan import InstancePlan
from kanri.postgres.topology.storage import StoragePlan, plan_storage
from kanri.runtime import is_controlled_by
from kanri.runtime.kinds import POD_DISRUPTION_BUDGET, PVC, STATEFUL_SET, STORAGE_CLASS

__all__ = ["budgets", "check_storage_class", "scale", "storage"]


async def scale(step: Pass, plan: InstancePlan) -> bool:
    """Remove the replicas the plan drops (StatefulSet, then volume: a replica's data is on the primary)."""
    before = len(plan.instances) - len(plan.added) + len(plan.removed)
    scaling = before > 0 and bool(plan.added or plan.removed)  # not the cluster's creation
    if scaling:
        change = [f"adding {', '.join(plan.added)}" if plan.added else "",
                  f"removing {', '.join(plan.removed)}" if plan.removed else ""]  # fmt: skip
        await step.events.normal(step.cluster, "Scaling", f"instances {before} -> {len(plan.instances)}: "
                                   + "; ".join(c for c in change if c))  # fmt: skip
    for instance in plan.removed:
        sts = step.cache.get(STATEFUL_SET, instance, step.namespace)
        if sts is not None and is_controlled_by(sts, step.cluster):
            deleted = step.client.delete(STATEFUL_SET, instance, step.namespace, propagation_policy="Background")
            if not await step.write(STATEFUL_SET, instance, deleted):
                continue  # the volume goes only after its pod
        if step.cache.get(PVC, instance, step.namespace) is not None:
            claim_deleted = step.client.delete(PVC, instance, step.namespace)
            if not await step.write(PVC, instance, claim_deleted):
                continue
        await step.events.normal(step.cluster, "RemovedInstance", f"removed replica {instance} and its volume")
    return scaling


async def budgets(step: Pass, plan: InstancePlan, *, serving: bool) -> None:
    """Disruption budgets while a primary runs (a lone one outside a maintenance window, once it served: ``serving``
    says its instance reports ready now, and a budget made earlier is kept); none otherwise (nor under the old
    replica name). A lone pod that never served loses nothing to a drain, and a budget on it would only hold the
    drain."""
    unwanted = [names.legacy_replica_pdb(step.name)]
    window = step.spec.node_maintenance_window
    count = len(plan.instances)
    made = step.cache.get(POD_DISRUPTION_BUDGET, names.primary_pdb(step.name), step.namespace) is not None
    wanted = wants_budgets(count, not step.running, maintenance=window is not None and window.in_progress)
    if wanted and count == 1 and not (serving or made):
        wanted = False
    if wanted:
        by_app = cluster_routes_by_app(step.cache, step.cluster)
        for budget in disruption_budgets(step.cluster, by_app=by_app, instances=count):
            await step.apply(POD_DISRUPTION_BUDGET, budget)
        if count < 2:
            unwanted.append(names.replica_pdb(step.name))
    else:
        unwanted += [names.primary_pdb(step.name), names.replica_pdb(step.name)]
    for name in unwanted:
        existing = step.cache.get(POD_DISRUPTION_BUDGET, name, step.namespace)
        if existing is not None and is_controlled_by(existing, step.cluster):
            deleted = step.client.delete(POD_DISRUPTION_BUDGET, name, step.namespace)
            await step.write(POD_DISRUPTION_BUDGET, name, deleted)


async def storage(step: Pass, plan: InstancePlan) -> StoragePlan:
    """Grow every claim to ``spec.storage.size`` when its class allows it; report it when it does not."""
    claims = [c for i in plan.instances if (c := step.cache.get(PVC, i, step.namespace)) is not None]
    classes = {c["metadata"]["name"]: c for c in step.cache.list(STORAGE_CLASS)}
    result = plan_storage(claims, step.spec.storage.size, classes)
    for name, patch in result.grow.items():
        await step.write(PVC, name, step.client.patch(PVC, name, patch, step.namespace))
    if result.grow:
        await step.events.normal(step.cluster, "ResizingStorage", f"growing volumes "
                                   f"{', '.join(sorted(result.grow))} to {step.spec.storage.size}")  # fmt: skip
    return result


def check_storage_class(step: Pass, plan: InstancePlan) -> None:
    """A class that does not exist leaves claims Pending forever: name it (the pods only say Pending)."""
    classes = {c["metadata"]["name"] for c in step.cache.list(STORAGE_CLASS)}
    missing: dict[str, list[str]] = {}
    wanted = step.spec.storage.storage_class_name
    if wanted and wanted not in classes:
        missing[wanted] = []
    for instance in plan.instances:
        pvc = step.cache.get(PVC, instance, step.namespace) or {}
        class_name = (pvc.get("spec") or {}).get("storageClassName")
        if class_name and class_name not in classes and (pvc.get("status") or {}).get("phase") != "Bound":
            missing.setdefault(class_name, []).append(instance)
    for class_name, waiting in missing.items():
        step.problems.append(storage_class_missing(class_name, waiting))
