"""RDS's shapes <-> the common fields: the parameters of CreateDBInstance / ModifyDBInstance built from a ``Desired``,
and a DescribeDBInstances entry read as an ``Observed``. Pure functions (unit-tested without a server)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kanri.cloud.providers.base import Desired, Observed

__all__ = ["OWNER_TAG", "create_parameters", "modify_parameters", "observed_from"]

OWNER_TAG = "kanri.dev/owner-uid"
"""The tag carrying the DatabaseInstance's uid: a database of our deterministic name with another uid is not ours."""
MASTER_USERNAME = "kanri"
DATABASE_NAME = "app"

# PendingModifiedValues keys -> common field (what RDS accepted but has not applied yet).
PENDING_FIELDS = {
    "DBInstanceClass": "size",
    "AllocatedStorage": "storage",
    "EngineVersion": "version",
    "BackupRetentionPeriod": "backupRetentionDays",
    "MultiAZ": "highAvailability",
    "StorageType": "providers.aws.storageType",
    "Iops": "providers.aws.iops",
}
# Extension keys -> RDS parameter; only keys the user set are sent or compared (RDS's defaults are never diffed).
EXTENSION_PARAMETERS = {"storageType": "StorageType", "iops": "Iops", "parameterGroup": "DBParameterGroupName"}


def _field_parameters(desired: Desired, instance_class: str) -> dict[str, dict[str, Any]]:
    """Each common field's RDS parameters (the map modify_parameters picks from)."""
    fields: dict[str, dict[str, Any]] = {
        "size": {"DBInstanceClass": instance_class},
        "storage": {"AllocatedStorage": desired.storage_gib},
        "version": {"EngineVersion": str(desired.version), "AllowMajorVersionUpgrade": True},
        "backupRetentionDays": {"BackupRetentionPeriod": desired.backup_retention_days},
        "highAvailability": {"MultiAZ": desired.high_availability},
        "network.access": {"PubliclyAccessible": desired.public},
    }
    if desired.maintenance_window is not None:
        fields["maintenanceWindow"] = {"PreferredMaintenanceWindow": desired.maintenance_window}
    for key, parameter in EXTENSION_PARAMETERS.items():
        if desired.extension.get(key) is not None:
            fields[f"providers.aws.{key}"] = {parameter: desired.extension[key]}
    return fields


def create_parameters(desired: Desired, instance_class: str, password: str, subnet_group: str | None) \
        -> dict[str, Any]:  # fmt: skip
    """CreateDBInstance's parameters: every field the user set, nothing RDS would default anyway."""
    parameters: dict[str, Any] = {
        "DBInstanceIdentifier": desired.identifier,
        "Engine": desired.engine,
        "MasterUsername": MASTER_USERNAME,
        "MasterUserPassword": password,
        "DBName": DATABASE_NAME,
        "Tags": [{"Key": OWNER_TAG, "Value": desired.owner_uid}]
        + [{"Key": key, "Value": value} for key, value in sorted(desired.tags.items())],
    }
    for field, values in _field_parameters(desired, instance_class).items():
        if field != "version":
            parameters |= values
    parameters["EngineVersion"] = str(desired.version)
    if subnet_group:
        parameters["DBSubnetGroupName"] = subnet_group
    return parameters


def modify_parameters(desired: Desired, instance_class: str, fields: tuple[str, ...], immediately: bool) \
        -> dict[str, Any]:  # fmt: skip
    """ModifyDBInstance's parameters for exactly ``fields`` (never a field that did not change)."""
    by_field = _field_parameters(desired, instance_class)
    parameters: dict[str, Any] = {"DBInstanceIdentifier": desired.identifier, "ApplyImmediately": immediately}
    for field in fields:
        parameters |= by_field.get(field, {})
    return parameters


def _major(version: str | None) -> str | None:
    return version.split(".")[0] if version else None


def observed_from(db: Mapping[str, Any]) -> Observed:
    """A DescribeDBInstances entry as the common fields (absent keys stay None: not reported is not a difference)."""
    tags = {tag["Key"]: tag["Value"] for tag in db.get("TagList") or []}
    endpoint = db.get("Endpoint") or {}
    pending = tuple(sorted({PENDING_FIELDS[key] for key in db.get("PendingModifiedValues") or {} if key in
                            PENDING_FIELDS}))  # fmt: skip
    groups = [group.get("DBParameterGroupName") for group in db.get("DBParameterGroups") or []]
    extension = {"storageType": db.get("StorageType"), "iops": db.get("Iops"),
                 "parameterGroup": groups[0] if groups else None}  # fmt: skip
    return Observed(
        external_id=db["DBInstanceIdentifier"],
        state=str(db.get("DBInstanceStatus", "unknown")).lower(),
        owner_uid=tags.get(OWNER_TAG),
        host=endpoint.get("Address"),
        port=endpoint.get("Port"),
        engine=db.get("Engine"),
        engine_version=db.get("EngineVersion"),
        size=db.get("DBInstanceClass"),
        storage_gib=db.get("AllocatedStorage"),
        public=db.get("PubliclyAccessible"),
        backup_retention_days=db.get("BackupRetentionPeriod"),
        high_availability=db.get("MultiAZ"),
        maintenance_window=db.get("PreferredMaintenanceWindow"),
        pending=pending,
        extension={key: value for key, value in extension.items() if value is not None},
        username=db.get("MasterUsername"),
        dbname=db.get("DBName"),
    )


def major_of(observed: Observed) -> int | None:
    """The engine's major version the database reports (``16.3`` -> 16)."""
    major = _major(observed.engine_version)
    return int(major) if major and major.isdigit() else None
