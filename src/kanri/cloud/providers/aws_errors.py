"""RDS errors -> who must act: ``Throttled`` (spend less), ``Retryable`` (try again), ``UserMustFix`` (change the spec
or class). Pure, so every code is unit-tested without a server."""

from __future__ import annotations

import re

from kanri.cloud.providers.base import ProviderError, Retryable, Throttled, UserMustFix

__all__ = ["classify", "field_of"]

THROTTLING = frozenset({"Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
                        "RequestThrottled", "SlowDown"})  # fmt: skip
# The database is busy with another change (modifying, backing-up): the same call works once it is available.
BUSY = frozenset({"InvalidDBInstanceState", "InvalidDBInstanceStateFault", "InvalidDBSnapshotState"})
USER = {
    "InvalidParameterCombination": "InvalidParameterCombination",
    "InvalidParameterValue": "InvalidParameterValue",
    "StorageQuotaExceeded": "QuotaExceeded",
    "InstanceQuotaExceeded": "QuotaExceeded",
    "InsufficientDBInstanceCapacity": "CapacityUnavailable",
    "DBParameterGroupNotFound": "ParameterGroupNotFound",
    "DBSubnetGroupNotFoundFault": "SubnetGroupNotFound",
    "DBSnapshotAlreadyExists": "FinalSnapshotExists",
    "StorageTypeNotSupported": "StorageTypeNotSupported",
    "InvalidClientTokenId": "CredentialsRefused",
    "UnrecognizedClientException": "CredentialsRefused",
    "SignatureDoesNotMatch": "CredentialsRefused",
    "AccessDenied": "AccessDenied",
    "AccessDeniedException": "AccessDenied",
    "DBInstanceAlreadyExists": "NameTaken",
}

# RDS's parameter names -> the DatabaseInstance field a user changes to fix an error that names one.
PARAMETER_FIELDS = {
    "AllocatedStorage": "storage",
    "DBInstanceClass": "size",
    "EngineVersion": "version",
    "Engine": "engine",
    "BackupRetentionPeriod": "backupRetentionDays",
    "MultiAZ": "highAvailability",
    "PubliclyAccessible": "network.access",
    "PreferredMaintenanceWindow": "maintenanceWindow",
    "FinalDBSnapshotIdentifier": "finalSnapshot",
    "StorageType": "providers.aws.storageType",
    "Iops": "providers.aws.iops",
    "DBParameterGroupName": "providers.aws.parameterGroup",
}
# RDS's messages often name a parameter in words ("Invalid DB Instance class: db.x"); checked in this order.
PHRASE_FIELDS = (
    ("instance class", "size"),
    ("engine version", "version"),
    ("major version", "version"),
    ("storage size", "storage"),
    ("allocated storage", "storage"),
    ("storage type", "providers.aws.storageType"),
    ("iops", "providers.aws.iops"),
    ("storage", "storage"),
    ("backup retention", "backupRetentionDays"),
    ("maintenance window", "maintenanceWindow"),
    ("multi-az", "highAvailability"),
    ("publicly accessible", "network.access"),
    ("snapshot", "finalSnapshot"),
    ("parameter group", "providers.aws.parameterGroup"),
)
_WORDS = re.compile(r"[A-Za-z]+")


def field_of(message: str) -> str | None:
    """The DatabaseInstance field an RDS error message names (its parameter name), if any."""
    words = set(_WORDS.findall(message))
    for parameter, field in PARAMETER_FIELDS.items():
        if parameter in words:  # exact case: "engine" in prose is not the Engine parameter
            return field
    lowered = message.lower()
    for phrase, field in PHRASE_FIELDS:
        if phrase in lowered:
            return field
    return None


def classify(code: str, message: str, status: int, action: str) -> ProviderError:
    """The error for RDS's ``code``, ``message`` and HTTP ``status`` answering ``action`` (CreateDBInstance...)."""
    text = f"{action}: {code}: {message}"
    if code in THROTTLING or status == 429:
        return Throttled(text, action=action)
    if status >= 500 or code in {"InternalFailure", "ServiceUnavailable", "InternalError"}:
        return Retryable(text, action=action)
    if code in BUSY:
        return Retryable(text, action=action)
    if code in USER:
        return UserMustFix(text, field=field_of(message), reason=USER[code], action=action)
    return UserMustFix(text, field=field_of(message), reason="ProviderRefused", action=action)
