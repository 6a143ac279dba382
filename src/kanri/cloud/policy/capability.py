"""Which fields a DatabaseInstance sets that its provider cannot honour: each is named (the Unsupported condition),
never silently ignored. Pure."""

from __future__ import annotations

from typing import Any

from kanri.cloud.api import DatabaseInstanceSpec
from kanri.cloud.providers.base import COMMON_FIELDS, Capabilities

__all__ = ["matrix", "set_fields", "unsupported"]

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


def matrix(rows: dict[str, Capabilities]) -> str:
    """The capability matrix as the Markdown table docs/cloud.md carries (a unit test keeps the two equal):
    yes = honoured, downtime = honoured with downtime (planned), immutable = set at create only, no = Unsupported."""
    names = sorted(rows)
    lines = ["| field | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]

    def cell(caps: Capabilities, field: str, extension: str | None = None) -> str:
        path = f"providers.{extension}.{field}" if extension else field
        if extension is not None and field not in caps.extension_fields:
            return "no"
        if extension is None and field not in caps.fields:
            return "no"
        if path in caps.immutable_fields:
            return "immutable"
        return "downtime" if path in caps.downtime_fields else "yes"

    for field in COMMON_FIELDS:
        lines.append(f"| `{field}` | " + " | ".join(cell(rows[n], field) for n in names) + " |")
    for name in names:
        for key in sorted(rows[name].extension_fields):
            cells = " | ".join(cell(rows[n], key, name) if n == name else "no" for n in names)
            lines.append(f"| `providers.{name}.{key}` | {cells} |")
    return "\n".join(lines)
