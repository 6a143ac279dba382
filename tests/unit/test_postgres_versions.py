"""The image major comes from the data; a higher spec.version is only a request, reported in a condition."""

from __future__ import annotations

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.upgrade.versions import running_major, upgrade_verdict


def report(name: str, data_version: int | None) -> InstanceReport:
    return InstanceReport(name=name, role="replica", ready=False, running=False, data_version=data_version)


def test_the_data_decides_the_major_and_spec_only_a_new_cluster() -> None:
    assert running_major(15, {"db-1": report("db-1", 16)}, 14, 17) == 15
    assert running_major(None, {"db-1": report("db-1", 16), "db-2": report("db-2", None)}, 14, 17) == 16
    assert running_major(None, {"db-1": report("db-1", None)}, 14, 17) == 14
    assert running_major(None, {}, None, 17) == 17


def test_a_raised_version_waits_for_approval_then_reports_the_upgrade_approved() -> None:
    same = upgrade_verdict(15, 15, None)
    assert (same.reason, same.warn) == ("NotRequested", False)
    asked = upgrade_verdict(15, 16, None)
    assert (asked.reason, asked.warn) == ("UpgradeNotApproved", True)
    assert "approvedVersion: 16" in asked.message
    assert "15" in asked.message
    assert upgrade_verdict(15, 16, 17).reason == "UpgradeNotApproved"
    approved = upgrade_verdict(15, 16, 16)
    assert (approved.reason, approved.warn) == ("UpgradeApproved", False)
    assert "status.upgrade" in approved.message
    assert upgrade_verdict(16, 15, None).reason == "DowngradeNotSupported"
