"""Which instance is the primary, and when a replica may be removed: decided from what the instances report.

``status.currentPrimary`` is only what the operator last wrote — and anyone who may edit the status can rewrite it.
Deleting an instance's volume on the strength of it once deleted the real primary's data. So:

- the primary is the instance that *reports* itself primary — with several (split brain), the one the operator
  recorded, never the highest timeline (``splitbrain.py`` decides, and fences the others); before anyone reports,
  the claim annotated ``kanri.dev/last-primary`` (written from an earlier report, it survives an operator restart and
  a recreated cluster), then status, then an instance already told to bootstrap as primary;
- a replica is removed only when, in the same pass, it reported role replica and exactly one other instance
  reported primary on a timeline at least as high as its own. Anything else (no report, a stopped or hibernated
  cluster, two primaries, a replica ahead of the primary) makes the removal wait, with the reason in status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.topology.plan import InstancePlan

__all__ = ["choose_primary", "gate_removals", "removal_blocker"]


def choose_primary(
    instances: Sequence[str],
    reported: str | None,
    *,
    recorded: str | None,
    status: str | None,
    bootstrapping: str | None,
) -> str | None:
    """The primary among ``instances`` (those with a volume or a StatefulSet): the reported one
    (``splitbrain.decide``'s verdict) first, then what the claims recorded, then status, then the bootstrap primary;
    None when none of them names an existing instance."""
    for candidate in (reported, recorded, status, bootstrapping):
        if candidate is not None and candidate in instances:
            return candidate
    return None


def removal_blocker(instance: str, reports: Mapping[str, InstanceReport]) -> str | None:
    """Why ``instance`` may not be removed now (None: it may). Only a replica proven so this pass goes."""
    own = reports.get(instance)
    if own is None:
        return f"{instance} has not reported its role"
    if own.role != "replica":
        return f"{instance} reports itself {own.role}"
    primaries = [name for name, r in reports.items() if r.role == "primary"]
    if not primaries:
        return "no instance reports itself primary"
    if len(primaries) > 1:
        return f"several instances report themselves primary: {', '.join(sorted(primaries))}"
    primary = reports[primaries[0]]
    if primary.timeline is None or own.timeline is None:
        return f"{primaries[0]} or {instance} did not report a timeline"
    if primary.timeline < own.timeline:
        return f"{instance} is on timeline {own.timeline}, ahead of primary {primaries[0]} ({primary.timeline})"
    return None


def gate_removals(plan: InstancePlan, reports: Mapping[str, InstanceReport]) -> tuple[InstancePlan, dict[str, str]]:
    """The plan with only the removals :func:`removal_blocker` allows; the others stay instances (running, so they
    can report) and are returned with why they wait."""
    waiting = {name: why for name in plan.removed if (why := removal_blocker(name, reports)) is not None}
    if not waiting:
        return plan, {}
    kept = sorted([*plan.instances, *waiting], key=lambda name: int(name.rpartition("-")[2]))  # <cluster>-<n>
    removed = [name for name in plan.removed if name not in waiting]
    return replace(plan, instances=kept, removed=removed), waiting
