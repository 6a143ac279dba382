"""A DatabaseInstance and its class resolved into the provider's ``Desired``. Pure."""

from __future__ import annotations

import math
from typing import Any

from kanri.cloud import naming
from kanri.cloud.api import DatabaseClassSpec, DatabaseInstanceSpec
from kanri.cloud.policy.guardrails import class_region
from kanri.cloud.providers.base import Desired
from kanri.runtime import parse_quantity

__all__ = ["desired_of", "storage_gib"]

_GIB = 1 << 30


def storage_gib(quantity: str) -> int:
    """Whole GiB, rounded up (RDS allocates whole GiB: 20Gi -> 20, 20G -> 19, 1.5Gi -> 2)."""
    return max(1, math.ceil(parse_quantity(quantity) / _GIB))


def desired_of(obj: dict[str, Any], spec: DatabaseInstanceSpec, cls: DatabaseClassSpec) -> Desired:
    meta = obj["metadata"]
    block = getattr(spec.providers, cls.provider)
    extension = block.model_dump(exclude_none=True) if block is not None else {}
    return Desired(
        identifier=spec.adopt_external_id or naming.identifier(meta["namespace"], meta["name"]),
        owner_uid=meta["uid"],
        namespace=meta["namespace"],
        name=meta["name"],
        engine=spec.engine,
        version=spec.version,
        size=spec.size,
        storage_gib=storage_gib(spec.storage),
        region=spec.region or class_region(cls),
        public=spec.network.access == "Public",
        allowed_cidrs=tuple(spec.network.allowed_cidrs),
        backup_retention_days=spec.backup_retention_days,
        high_availability=spec.high_availability,
        maintenance_window=spec.maintenance_window,
        extension=extension,
        tags={"kanri.dev/namespace": meta["namespace"], "kanri.dev/name": meta["name"]},
    )
