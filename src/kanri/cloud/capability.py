"""Which fields a DatabaseInstance sets that its provider cannot honour: each is named (the Unsupported condition),
never silently ignored. Pure."""

from __future__ import annotations

from typing import Any

from kanri.cloud.api import DatabaseInstanceSpec
from kanri.cloud.providers.base import Capabilities

__all__ = ["set_fields", "unsupported"]

_DEFAULTS = DatabaseInstanceSpec(class_name="x", version=16)


def set_fields(spec: DatabaseInstanceSpec) -> set[str]:
    """The common fields (COMMON_FIELDS paths) set to something other than their default, plus the ones every
    database has (engine, version, size, storage, region), which a provider must honour whatever their value."""
    fields = {"engine", "version", "size", "storage", "region"}
    pairs: dict[str, tuple[Any, Any]] = {
        "network.access": (spec.network.access, _DEFAULTS.network.access),
        "network.allowedCidrs": (spec.network.allowed_cidrs, []),
        "backupRetentionDays": (spec.backup_retention_days, _DEFAULTS.backup_retention_days),
        "highAvailability": (spec.high_availability, False),
        "maintenanceWindow": (spec.maintenance_window, None),
        "adoptExternalId": (spec.adopt_external_id, None),
    }
    fields |= {path for path, (value, default) in pairs.items() if value != default}
    if spec.deletion_policy == "Delete" and spec.final_snapshot:
        fields.add("finalSnapshot")
    return fields


def unsupported(spec: DatabaseInstanceSpec, provider: str, capabilities: Capabilities) -> list[str]:
    """Set fields outside the provider's capabilities, and extension blocks or keys it does not read, sorted."""
    found = sorted(set_fields(spec) - capabilities.fields)
    blocks = spec.providers.model_dump(exclude_none=True)
    for name, block in sorted(blocks.items()):
        if name != provider:
            found.append(f"providers.{name}")
            continue
        found += [f"providers.{name}.{key}" for key in sorted(block) if key not in capabilities.extension_fields]
    return found
