"""The PostgreSQL major the instances run, from the data — and what a different ``spec.version`` means.

A data directory can only be opened by its own major's binaries; moving it to another major takes ``pg_upgrade``,
which is a procedure with an approval gate (``spec.upgrade.approvedVersion``), not an image change. So the image
major is never taken from ``spec.version`` once data exists, nor from the StatefulSets (a hand edit would stick):

1. the major recorded on the claims (``kanri.dev/pg-major``, from the instances' ``dataVersion``);
2. else a report's ``dataVersion`` (this pass, before it could be recorded);
3. else ``status.postgresMajor`` (a lost volume's replacement still belongs to the old major);
4. else ``spec.version``: a brand-new cluster.

``spec.version`` above the running major is a requested upgrade: nothing changes until it is approved, and the
``MajorUpgrade`` condition says what it waits for; the upgrade itself is :mod:`kanri.postgres.upgrade.machine` and
:mod:`kanri.postgres.upgrade.step`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.upgrade.machine import no_repository

__all__ = ["UpgradeVerdict", "running_major", "upgrade_verdict"]


def running_major(
    recorded: int | None, reports: Mapping[str, InstanceReport], status_major: int | None, spec_version: int
) -> int:
    """The major the StatefulSets' image must have (see the module docstring for the order)."""
    if recorded is not None:
        return recorded
    reported = [r.data_version for r in reports.values() if r.data_version is not None]
    if reported:
        return min(reported)
    return status_major if status_major is not None else spec_version


@dataclass(frozen=True)
class UpgradeVerdict:
    """The ``MajorUpgrade`` condition: False while the data's major is not ``spec.version``, with why (the
    upgrade's own progress is ``status.upgrade``)."""

    reason: str
    message: str
    warn: bool
    """Worth a Warning Event when the condition turns to it (the user asked for something that does not happen)."""


def upgrade_verdict(
    running: int, version: int, approved: int | None, repository_missing: str | None = None
) -> UpgradeVerdict:
    """What ``spec.version`` = ``version`` means for data of major ``running`` (``repository_missing``: why an
    approved upgrade's fresh backup cannot be taken, :func:`kanri.postgres.upgrade.step.repository_missing`)."""
    if version == running:
        return UpgradeVerdict("NotRequested", f"PostgreSQL {running} runs, as spec.version asks", warn=False)
    if version < running:
        return UpgradeVerdict(
            "DowngradeNotSupported",
            f"spec.version {version} is below the data's major {running}: PostgreSQL {running} keeps running "
            f"(a data directory cannot be downgraded; restore a dump into a new cluster instead)",
            warn=True,
        )
    if approved != version:
        return UpgradeVerdict(
            "UpgradeNotApproved",
            f"spec.version {version} is above the data's major {running}: a major upgrade needs "
            f"spec.upgrade.approvedVersion: {version}; PostgreSQL {running} keeps running until then",
            warn=True,
        )
    if repository_missing is not None:
        return UpgradeVerdict("NoBackupRepository", no_repository(running, version, repository_missing), warn=True)
    return UpgradeVerdict(
        "UpgradeApproved",
        f"the upgrade from {running} to {version} is approved: status.upgrade shows its gates and steps "
        f"(PostgreSQL {running} runs until the check passed and the upgrade began)",
        warn=False,
    )
