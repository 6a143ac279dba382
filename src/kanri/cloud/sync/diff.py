"""Which fields differ between what is asked and what the provider reports: the only fields a modify sends.

The anchors' endless-update bug came from comparing against fields the provider fills in by itself. Here a field is
compared only when the user set it (or every database has it) and the provider reports it; a change already
accepted and pending counts as asked. A converged database therefore costs no update call. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from kanri.cloud.providers.base import Capabilities, Desired, Observed, UserMustFix

__all__ = ["Plan", "changes", "plan"]


def _major(version: str | None) -> int | None:
    head = (version or "").split(".")[0]
    return int(head) if head.isdigit() else None


def changes(desired: Desired, observed: Observed, provider_size: str, provider: str) -> tuple[str, ...]:
    """The common fields (and ``providers.<name>.<key>``) whose desired value the database does not have, sorted.
    Raises UserMustFix for what no modify can do: shrinking storage, a major downgrade."""
    if observed.storage_gib is not None and desired.storage_gib < observed.storage_gib:
        raise UserMustFix(f"storage {desired.storage_gib}Gi is below the database's {observed.storage_gib}Gi: "
                          "storage cannot shrink", field="storage", reason="StorageShrink")  # fmt: skip
    major = _major(observed.engine_version)
    if major is not None and desired.version < major:
        raise UserMustFix(f"version {desired.version} is below the database's {major}: no downgrade in place",
                          field="version", reason="VersionDowngrade")  # fmt: skip
    compared: dict[str, tuple[object, object]] = {
        "size": (provider_size, observed.size),
        "storage": (desired.storage_gib, observed.storage_gib),
        "version": (desired.version, major),
        "backupRetentionDays": (desired.backup_retention_days, observed.backup_retention_days),
        "highAvailability": (desired.high_availability, observed.high_availability),
        "network.access": (desired.public, observed.public),
    }
    if desired.maintenance_window is not None:
        compared["maintenanceWindow"] = (
            desired.maintenance_window.lower(),
            (observed.maintenance_window or "").lower(),
        )
    found = {field for field, (want, have) in compared.items() if have is not None and want != have}
    # The instance class is part of the size comparison; other extension keys only when set.
    for key, want in desired.extension.items():
        have = observed.extension.get(key)
        if key != "instanceClass" and have is not None and want != have:
            found.add(f"providers.{provider}.{key}")
    return tuple(sorted(found - set(observed.pending)))


@dataclass(frozen=True)
class Plan:
    """What to send now and what waits. ``now``: applied immediately; ``window``: left to the maintenance window;
    ``approval``: needs downtime and no window is set, so it waits for an approval naming it."""

    now: tuple[str, ...]
    window: tuple[str, ...]
    approval: tuple[str, ...]


def plan(fields: tuple[str, ...], capabilities: Capabilities, maintenance_window: str | None,
         approved: bool) -> Plan:  # fmt: skip
    downtime = tuple(field for field in fields if field in capabilities.downtime_fields)
    rest = tuple(field for field in fields if field not in capabilities.downtime_fields)
    if not downtime:
        return Plan(rest, (), ())
    if maintenance_window is not None:
        return Plan(rest, downtime, ())
    if approved:
        return Plan(fields, (), ())
    return Plan(rest, (), downtime)
