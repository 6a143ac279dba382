"""RDS's documented rules for ModifyDBInstance and DeleteDBInstance that moto does not enforce, as pure functions.

Sources (AWS's API reference and RDS user guide): storage can only grow, by at least 10 % (a smaller increase is
rounded up to 10 %), and not again within six hours of the last change or while it is being optimized; a major version
upgrade needs ``AllowMajorVersionUpgrade``, a downgrade is refused; an instance that is not ``available`` cannot be
modified; without ``ApplyImmediately`` a change of class, storage, version or Multi-AZ waits for the maintenance window
(``PendingModifiedValues``); deleting needs ``FinalDBSnapshotIdentifier`` unless ``SkipFinalSnapshot=true``, and a
final snapshot cannot be taken of an instance that is still being created. The messages are RDS's as its users quote
them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .wire import RdsError, is_true

DEFERRABLE = ("AllocatedStorage", "DBInstanceClass", "EngineVersion", "MultiAZ", "StorageType", "Iops")
"""The changes RDS holds for the maintenance window unless ``ApplyImmediately`` is set."""
_NOT_CHANGES = {"Action", "Version", "DBInstanceIdentifier", "ApplyImmediately", "AllowMajorVersionUpgrade"}
_MODIFIABLE = ("available", "storage-optimization")


@dataclass(frozen=True)
class Current:
    """What the instance is now (read from moto) and what the emulator knows beyond it."""

    identifier: str
    status: str
    engine: str
    engine_version: str
    storage: int
    storage_type: str
    storage_locked: bool


@dataclass(frozen=True)
class Modification:
    """A ModifyDBInstance call as RDS would carry it out: what applies now and what waits for the window."""

    now: dict[str, str]
    deferred: dict[str, str]

    @property
    def storage(self) -> bool:
        return "AllocatedStorage" in self.now


def plan_modify(params: dict[str, str], current: Current) -> Modification:
    """The call's effect, or the RdsError RDS answers it with."""
    changes = {k: v for k, v in params.items() if k not in _NOT_CHANGES}
    if not changes:
        raise RdsError("InvalidParameterCombination", "No modifications were requested")
    if current.status not in _MODIFIABLE:
        raise RdsError("InvalidDBInstanceState", "Database instance is not in available state.")
    if "AllocatedStorage" in changes:
        changes["AllocatedStorage"] = str(_storage(int(changes["AllocatedStorage"]), current))
        if changes["AllocatedStorage"] == str(current.storage):
            del changes["AllocatedStorage"]
    if "EngineVersion" in changes:
        _check_version(changes["EngineVersion"], current, is_true(params.get("AllowMajorVersionUpgrade")))
    if is_true(params.get("ApplyImmediately")):
        return Modification(changes, {})
    deferred = {k: v for k, v in changes.items() if k in DEFERRABLE}
    return Modification({k: v for k, v in changes.items() if k not in deferred}, deferred)


def _storage(wanted: int, current: Current) -> int:
    if wanted < current.storage:
        raise RdsError(
            "InvalidParameterCombination",
            f"Invalid storage size for engine name {current.engine} and storage type {current.storage_type}: {wanted}",
        )
    if wanted == current.storage:
        return wanted
    if current.storage_locked:
        raise RdsError(
            "InvalidParameterCombination",
            "You can't currently modify the storage of this DB instance because the previous storage change is "
            "being optimized.",
        )
    return max(wanted, -(-current.storage * 11 // 10))  # +10 % rounded up, in integers (110.00000000000001 is not 111)


def _major(version: str) -> tuple[int, ...]:
    parts = [int(p) for p in version.split(".") if p.isdigit()]
    # PostgreSQL 10+ and MySQL 8+ name a major by its first number; older releases by the first two.
    return tuple(parts[:1] if parts and parts[0] >= 10 else parts[:2])


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def _check_version(wanted: str, current: Current, allow_major: bool) -> None:
    if _numbers(wanted) < _numbers(current.engine_version):
        raise RdsError(
            "InvalidParameterCombination",
            f"Cannot upgrade {current.engine} from {current.engine_version} to {wanted}",
        )
    if _major(wanted) != _major(current.engine_version) and not allow_major:
        raise RdsError(
            "InvalidParameterCombination",
            "The AllowMajorVersionUpgrade flag must be present when upgrading to a new major version.",
        )


def final_snapshot(params: dict[str, str], current: Current) -> str | None:
    """The final snapshot a DeleteDBInstance call asks for (None when skipped), or the RdsError RDS answers."""
    if current.status == "deleting":
        raise RdsError("InvalidDBInstanceState", f"Instance {current.identifier} is already being deleted.")
    snapshot = params.get("FinalDBSnapshotIdentifier") or None
    if is_true(params.get("SkipFinalSnapshot")):
        if snapshot:
            raise RdsError(
                "InvalidParameterCombination",
                "FinalDBSnapshotIdentifier can not be specified when deleting a DB instance with SkipFinalSnapshot.",
            )
        return None
    if snapshot is None:
        required = "FinalDBSnapshotIdentifier is required unless SkipFinalSnapshot is specified."
        raise RdsError("InvalidParameterCombination", required)
    if current.status == "creating":
        raise RdsError(
            "InvalidDBInstanceState",
            f"Instance {current.identifier} is currently creating - a final snapshot cannot be taken.",
        )
    return snapshot
