"""The operator's ``instance.json`` (the ConfigMap file every instance manager reads), declared once for both sides.

The operator writes it (keys sorted, so the same input gives the same bytes); the instance manager re-reads it every
``config_interval`` and keeps the last good one when a new one does not parse (:meth:`ClusterConfig.parse`). It
holds no secret: the repositories' key pairs are in the files of mounted Secrets.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer, model_validator

__all__ = ["LSN_PATTERN", "ArchiveTarget", "ClusterConfig", "RecoveryPlan", "UpgradeNote"]


def _none(value: Any) -> bool:
    return value is None


class ArchiveTarget(BaseModel):
    """Where this cluster's WAL and base backups go: ``<destination>/<serverName>/`` on an S3 endpoint."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    destination: str = Field(pattern=r"^s3://[a-z0-9][a-z0-9.-]*[a-z0-9](/[^\s]*)?$")
    """``s3://<bucket>[/<path>]``."""
    endpoint: str = Field(alias="endpointURL", pattern=r"^https?://\S+$")
    server_name: str = Field(alias="serverName", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.pg[0-9]{2})?$")
    """The folder under the destination: the cluster's name, with ``.pg<major>`` once a major upgrade made a new
    PostgreSQL system (``kanri.postgres.backup.archiving.upgraded_server_name``)."""
    region: str | None = Field(default=None, pattern=r"^[a-z0-9-]+$", exclude_if=_none)

    def system(self, server: str) -> ArchiveTarget:
        """The same repository, for another PostgreSQL system of this cluster (``<cluster>`` or
        ``<cluster>.pg<major>``); ValueError for another cluster's server name or an invalid one."""
        if server.partition(".")[0] != self.server_name.partition(".")[0]:
            raise ValueError(f"server {server} is not a system of {self.server_name.partition('.')[0]}")
        return ArchiveTarget.model_validate({**self.model_dump(by_alias=True), "serverName": server})


LSN_PATTERN = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"


class RecoveryPlan(BaseModel):
    """Which backup of which server to restore, and where replay stops (nothing set: the end of the archived WAL)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    source: ArchiveTarget
    """The source's repository and server name (its cluster's name): read from, never written to."""
    backup: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,253}$", exclude_if=_none)
    """A backup id; None: the newest one that finished before the target (time or LSN), or the newest one."""
    target_time: datetime | None = Field(default=None, alias="targetTime", exclude_if=_none)
    target_lsn: str | None = Field(default=None, alias="targetLSN", pattern=LSN_PATTERN, exclude_if=_none)
    target_immediate: bool = Field(default=False, alias="targetImmediate", exclude_if=lambda v: not v)
    """Stop as soon as the backup is consistent (its end), replaying no more WAL."""

    @model_validator(mode="after")
    def _one_target(self) -> RecoveryPlan:
        chosen = [self.target_time is not None, self.target_lsn is not None, self.target_immediate]
        if sum(chosen) > 1:
            raise ValueError("at most one of targetTime, targetLSN and targetImmediate")
        if self.target_time is not None and self.target_time.tzinfo is None:
            raise ValueError("targetTime needs a time zone")
        return self

    @field_serializer("target_time")
    def _iso(self, value: datetime | None) -> str | None:
        return value.isoformat() if value is not None else None  # as the operator has always written it

    def describe(self) -> str:
        """For logs, status and Events: which backup and where replay stops."""
        backup = self.backup or "the latest backup"
        if self.target_time is not None:
            until = f"up to {self.target_time.isoformat()}"
        elif self.target_lsn is not None:
            until = f"up to LSN {self.target_lsn}"
        elif self.target_immediate:
            until = "to its consistent end only"
        else:
            until = "to the end of the archived WAL"
        return f"{backup} of {self.source.server_name} ({self.source.destination}), {until}"


class UpgradeNote(BaseModel):
    """``upgrade`` in instance.json while a major upgrade starts the cluster again: the data of ``primary`` is of
    major ``to`` now; a replica whose data is of an older major is cloned again from it (its old data can never
    follow the new primary)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    to: int = Field(ge=1)
    primary: str = Field(min_length=1)


class ClusterConfig(BaseModel):
    """The operator's ``instance.json``: user parameters, the cluster's instance names, synchronous standbys,
    (once the cluster has been initialised) the system identifier every data directory of the cluster must have,
    where WAL is archived (absent: no archiving), and which backup a new cluster restores (absent: initdb)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    parameters: dict[str, str | int | float | bool] = Field(default_factory=dict)
    instances: tuple[str, ...] = ()
    synchronous_standbys: int = Field(default=0, ge=0, alias="synchronousStandbys")
    system_identifier: str | None = Field(
        default=None, alias="systemIdentifier", pattern=r"^[0-9]{1,20}$", exclude_if=_none
    )
    archive: ArchiveTarget | None = Field(default=None, exclude_if=_none)
    recovery: RecoveryPlan | None = Field(default=None, exclude_if=_none)
    """Where a new cluster's primary restores its first data from (``bootstrap.recovery``; absent: initdb)."""
    upgrade: UpgradeNote | None = Field(default=None, exclude_if=_none)

    def render(self) -> str:
        """The file as the operator writes it: keys sorted (the same config, the same bytes), optional entries only
        when set."""
        return json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True, indent=2) + "\n"

    @classmethod
    def parse(cls, raw: bytes) -> ClusterConfig:
        """Parse the file's bytes; raises ValueError with a short reason (never the whole file)."""
        try:
            return cls.model_validate(json.loads(raw or b"{}"))
        except UnicodeDecodeError:  # its message would quote a byte of the file
            raise ValueError("config file is not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"config file is not JSON: {exc.msg} at line {exc.lineno}") from None
        except ValidationError as exc:
            raise ValueError(
                f"config file is invalid: {exc.error_count()} error(s): {exc.errors()[0]['msg']}"
            ) from None
