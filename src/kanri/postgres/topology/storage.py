"""Growing the instances' volumes: which claims to patch, which are still resizing, and when it cannot work.

A bigger ``spec.storage.size`` raises every claim's request; the StorageClass's expander then grows the volume and
the claim's ``status.capacity`` follows. A class without ``allowVolumeExpansion: true`` cannot grow (the API server
refuses the patch): the operator checks that first and reports it as a condition instead of retrying a write that
can only fail — the user has to act (a class that allows expansion, or a restore into a bigger cluster).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kanri.postgres.children.pvc import claim_capacity, claim_request, grow_patch
from kanri.runtime import parse_quantity

__all__ = ["StoragePlan", "plan_storage"]

Obj = dict[str, Any]


@dataclass(frozen=True)
class StoragePlan:
    """What to do about the claims' sizes."""

    grow: dict[str, Obj] = field(default_factory=dict)
    """Claim name -> merge patch raising its request."""
    blocked: list[str] = field(default_factory=list)
    """Claims that should grow but whose class does not allow expansion (or does not exist)."""
    resizing: list[str] = field(default_factory=list)
    """Bound claims whose capacity is still below their request."""
    blocked_class: str | None = None


def plan_storage(claims: Iterable[Obj], size: str, classes: dict[str, Obj]) -> StoragePlan:
    """Compare every claim with ``size``; ``classes`` maps StorageClass names to the objects."""
    grow: dict[str, Obj] = {}
    blocked: list[str] = []
    resizing: list[str] = []
    blocked_class: str | None = None
    for pvc in claims:
        name = pvc["metadata"]["name"]
        patch = grow_patch(pvc, size)
        if patch is not None and claim_request(pvc) is not None:
            class_name = (pvc.get("spec") or {}).get("storageClassName")
            storage_class = classes.get(class_name) if class_name else None
            if storage_class is not None and storage_class.get("allowVolumeExpansion") is True:
                grow[name] = patch
            else:
                blocked.append(name)
                blocked_class = class_name or "(none)"
            continue
        request, capacity = claim_request(pvc), claim_capacity(pvc)
        if request is not None and capacity is not None and parse_quantity(capacity) < parse_quantity(request):
            resizing.append(name)
    return StoragePlan(grow=grow, blocked=sorted(blocked), resizing=sorted(resizing), blocked_class=blocked_class)
