"""The pure parts of a restore: the backup listing, which backup a target needs, the recovery keys and the
staging configuration, and a rehearsal's verdict."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from kanri.instance.archive import ArchiveTarget
from kanri.instance.config import ClusterConfig
from kanri.instance.recovery_plan import RecoveryPlan
from kanri.instance.rehearsal import MESSAGE_LIMIT, Check, Verdict, report
from kanri.instance.restore import (
    BackupInfo,
    RestoreError,
    choose_backup,
    parse_backup_list,
    recovery_conf,
    recovery_parameters,
    restore_command,
    wal_restore_argv,
)

SOURCE = ArchiveTarget(destination="s3://bk/p", endpointURL="http://s3:8333", serverName="orders")


def plan(**fields: object) -> RecoveryPlan:
    return RecoveryPlan.model_validate({"source": SOURCE.model_dump(by_alias=True), **fields})


def backup(backup_id: str, end: str, lsn: str, status: str = "DONE") -> BackupInfo:
    return BackupInfo(backup_id, status, None, datetime.fromisoformat(end), lsn, 1, True)


BACKUPS = [
    backup("20261201T000000", "2026-12-01T00:05:00+00:00", "0/5000100"),
    backup("20261201T120000", "2026-12-01T12:05:00+00:00", "0/9000100", status="FAILED"),
    backup("20261202T000000", "2026-12-02T00:05:00+00:00", "1/2000100"),
]


def test_the_listing_is_parsed_and_sorted_by_end_time() -> None:
    raw = json.dumps({"backups_list": [
        {"backup_id": "b2", "status": "DONE", "end_time_iso": "2026-12-02T00:05:00+00:00", "end_xlog": "0/9000100",
         "begin_time_iso": "2026-12-02T00:00:00+00:00", "timeline": 2, "data_checksums": "on"},
        {"backup_id": "b1", "status": "DONE", "end_time_iso": "2026-12-01T00:05:00+00:00", "end_xlog": "0/5000100",
         "timeline": 1, "data_checksums": "off"},
    ]})  # fmt: skip
    found = parse_backup_list(raw)
    assert [b.backup_id for b in found] == ["b1", "b2"]
    assert found[1].timeline == 2
    assert found[1].data_checksums is True
    assert found[0].data_checksums is False
    assert found[1].begin_time == datetime(2026, 12, 2, tzinfo=UTC)


def test_a_listing_that_is_not_one_is_refused() -> None:
    with pytest.raises(RestoreError, match="did not answer a backup list"):
        parse_backup_list("Barman cloud backup list exception")


def test_without_a_target_the_newest_complete_backup_is_chosen() -> None:
    assert choose_backup(BACKUPS, plan()).backup_id == "20261202T000000"


def test_a_target_time_takes_the_newest_backup_that_ended_before_it_and_skips_failed_ones() -> None:
    chosen = choose_backup(BACKUPS, plan(targetTime="2026-12-01T23:00:00Z"))
    assert chosen.backup_id == "20261201T000000"


def test_a_target_lsn_takes_the_newest_backup_that_ended_at_or_before_it() -> None:
    assert choose_backup(BACKUPS, plan(targetLSN="1/2000100")).backup_id == "20261202T000000"
    assert choose_backup(BACKUPS, plan(targetLSN="0/FFFFFFFF")).backup_id == "20261201T000000"


def test_a_target_before_every_backup_is_a_clear_error() -> None:
    with pytest.raises(RestoreError, match="no complete backup in s3://bk/p/orders ended before 2026-11-30"):
        choose_backup(BACKUPS, plan(targetTime="2026-11-30T00:00:00Z"))
    with pytest.raises(RestoreError, match=r"no complete backup in s3://bk/p/orders$"):
        choose_backup([], plan())


def test_a_named_backup_must_exist_and_be_complete() -> None:
    assert choose_backup(BACKUPS, plan(backup="20261201T000000")).backup_id == "20261201T000000"
    with pytest.raises(RestoreError, match="is FAILED, not DONE"):
        choose_backup(BACKUPS, plan(backup="20261201T120000"))
    with pytest.raises(RestoreError, match="backup nope is not in"):
        choose_backup(BACKUPS, plan(backup="nope"))


def test_only_one_target_and_a_time_zone_are_accepted() -> None:
    with pytest.raises(ValidationError, match="at most one of"):
        plan(targetTime="2026-12-01T00:00:00Z", targetImmediate=True)
    with pytest.raises(ValidationError, match="time zone"):
        plan(targetTime="2026-12-01T00:00:00")
    with pytest.raises(ValidationError):
        plan(targetLSN="not-an-lsn")


def test_the_recovery_keys_restore_from_the_named_source_and_promote_at_the_target() -> None:
    params = recovery_parameters(plan(targetTime="2026-12-01T10:00:00.5Z"), "recovery", python="/usr/bin/python3")
    assert params["restore_command"] == "/usr/bin/python3 -m kanri.instance restore-wal recovery %f %p"
    assert params["recovery_target_action"] == "promote"
    assert params["recovery_target_time"] == "2026-12-01 10:00:00.500000+00:00"
    assert params["recovery_target_timeline"] == "latest"
    assert "recovery_target" not in params
    assert recovery_parameters(plan(targetLSN="0/5000100"), "archive")["recovery_target_lsn"] == "0/5000100"
    assert recovery_parameters(plan(targetImmediate=True), "archive")["recovery_target"] == "immediate"
    end = recovery_parameters(plan(), "archive")
    assert {k for k in end if k.startswith("recovery_target")} == {"recovery_target_action", "recovery_target_timeline"}


def test_the_staging_conf_appends_the_restore_keys_after_the_managed_ones_so_they_win() -> None:
    base = "archive_command = 'kanri own'\nlisten_addresses = '*'\nhot_standby = 'on'\n"
    text = recovery_conf(base, {"restore_command": "x %f %p"})
    lines = text.splitlines()
    assert lines.index("listen_addresses = ''") > lines.index("listen_addresses = '*'")
    assert "hot_standby = 'off'" in lines
    assert lines[-1] == "restore_command = 'x %f %p'"


def test_the_restore_command_reads_the_source_server_and_carries_no_secret() -> None:
    argv = wal_restore_argv(SOURCE, "000000010000000000000003", "pg_wal/RECOVERYXLOG", {"KANRI_BARMAN_BIN": "/b"})
    assert argv[0] == "/b/barman-cloud-wal-restore"
    assert argv[-4:] == ["s3://bk/p", "orders", "000000010000000000000003", "pg_wal/RECOVERYXLOG"]
    assert "--addressing-style" in argv
    assert "AWS" not in restore_command("archive")


def test_the_cluster_config_carries_the_recovery_entry() -> None:
    raw = json.dumps({"recovery": {"source": SOURCE.model_dump(by_alias=True), "backup": "20261201T000000"}})
    config = ClusterConfig.parse(raw.encode())
    assert config.recovery is not None
    assert config.recovery.backup == "20261201T000000"
    assert config.recovery.describe() == "20261201T000000 of orders (s3://bk/p), to the end of the archived WAL"
    assert ClusterConfig.parse(b"{}").recovery is None


def test_a_verdict_succeeds_only_when_every_check_passed(tmp_path: Path) -> None:
    started = datetime(2026, 12, 2, tzinfo=UTC)
    good = Verdict(started, [Check("recovery", True, "fine"), Check("rows", True, "3 rows")], backup="b1")
    assert good.result == "Succeeded"
    bad = Verdict(started, [Check("recovery", True, "fine"), Check("amcheck", False, "index i is corrupt")])
    assert bad.result == "Failed"
    assert bad.message == "amcheck: index i is corrupt"
    assert Verdict(started).result == "Failed"  # nothing ran: not a pass
    line = report(good, tmp_path / "termination-log")
    assert json.loads((tmp_path / "termination-log").read_text()) == json.loads(line)
    assert json.loads(line)["result"] == "Succeeded"


def test_a_verdict_always_fits_the_termination_message(tmp_path: Path) -> None:
    checks = [Check(f"check-{i}", False, "x" * 300) for i in range(40)]
    line = report(Verdict(datetime(2026, 12, 2, tzinfo=UTC), checks), tmp_path / "t")
    assert len(line.encode()) <= MESSAGE_LIMIT
    assert json.loads(line)["result"] == "Failed"
