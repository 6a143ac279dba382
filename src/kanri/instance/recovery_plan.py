"""The ``recovery`` entry of ``instance.json``: restore this cluster's first data from another cluster's backups.

Written by the operator for a cluster with ``bootstrap.recovery`` (see :mod:`kanri.postgres.recovery`), read by the
instance manager when its primary bootstraps an empty volume (see :mod:`kanri.instance.restore`). No secret: the
source repository's key pair is in the files of the mounted ``<cluster>-recovery-credentials`` Secret.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kanri.instance.archive import ArchiveTarget

__all__ = ["LSN_PATTERN", "RecoveryPlan"]

LSN_PATTERN = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"


class RecoveryPlan(BaseModel):
    """Which backup of which server to restore, and where replay stops (nothing set: the end of the archived WAL)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    source: ArchiveTarget
    """The source's repository and server name (its cluster's name): read from, never written to."""
    backup: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,253}$")
    """A backup id; None: the newest one that finished before the target (time or LSN), or the newest one."""
    target_time: datetime | None = Field(default=None, alias="targetTime")
    target_lsn: str | None = Field(default=None, alias="targetLSN", pattern=LSN_PATTERN)
    target_immediate: bool = Field(default=False, alias="targetImmediate")
    """Stop as soon as the backup is consistent (its end), replaying no more WAL."""

    @model_validator(mode="after")
    def _one_target(self) -> RecoveryPlan:
        chosen = [self.target_time is not None, self.target_lsn is not None, self.target_immediate]
        if sum(chosen) > 1:
            raise ValueError("at most one of targetTime, targetLSN and targetImmediate")
        if self.target_time is not None and self.target_time.tzinfo is None:
            raise ValueError("targetTime needs a time zone")
        return self

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
