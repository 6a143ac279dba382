"""Which instances a cluster should have: numbering on scale-up, choice of victims on scale-down, hibernation.

Pure logic on names, so the rules are unit-tested exhaustively:

- instances are ``<cluster>-<n>``; new ones take the lowest free numbers (a removed ``-2`` is reused first);
- scale-down removes the highest-numbered replicas, never the primary;
- ``replicas: 0`` (hibernation) keeps every existing instance, only stopped, so waking reuses their volumes;
- the primary is the one status names, if it still exists; otherwise the lowest-numbered existing instance (its
  volume holds data), otherwise ``<cluster>-1``, the first instance created.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kanri.postgres.names import instance_name, instance_number

__all__ = ["InstancePlan", "plan_instances"]


@dataclass(frozen=True)
class InstancePlan:
    """The instances to keep or create, the one that is (or bootstraps as) primary, and what changes."""

    instances: list[str]
    """Every instance the cluster keeps (running, or stopped while hibernated), by number."""
    primary: str | None
    """None only for a hibernated cluster that has no instance at all."""
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    """Replicas to delete (StatefulSet and volume), highest number first."""

    @property
    def replicas(self) -> list[str]:
        return [name for name in self.instances if name != self.primary]


def plan_instances(cluster: str, replicas: int, existing: Iterable[str], current_primary: str | None) -> InstancePlan:
    """Plan ``cluster``'s instances for ``spec.replicas`` given the ``existing`` ones (PVCs or StatefulSets)."""
    numbers = sorted({n for name in existing if (n := instance_number(cluster, name)) is not None})
    have = [instance_name(cluster, n) for n in numbers]
    if current_primary in have:
        primary: str | None = current_primary
    else:
        primary = have[0] if have else None
    if replicas == 0:
        return InstancePlan(instances=have, primary=primary)
    if len(have) > replicas:
        candidates = [name for name in reversed(have) if name != primary]
        removed = candidates[: len(have) - replicas]
        kept = [name for name in have if name not in removed]
        return InstancePlan(instances=kept, primary=primary, removed=removed)
    added: list[str] = []
    taken = set(numbers)
    candidate = 1
    while len(have) + len(added) < replicas:
        if candidate not in taken:
            added.append(instance_name(cluster, candidate))
        candidate += 1
    everything = sorted([*have, *added], key=lambda name: instance_number(cluster, name) or 0)
    return InstancePlan(instances=everything, primary=primary or everything[0], added=added)
