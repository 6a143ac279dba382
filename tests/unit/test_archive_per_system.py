"""A major upgrade makes a new PostgreSQL system (its own identifier, timeline 1 again), which archives into a folder
of its own (``<cluster>.pg<major>``): the names, the first backup the schedule asks for, retention per folder, and a
restore that finds the backups of its major in either folder and replays WAL from the one its backup is in."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from kanri.instance.archive import ArchiveTarget
from kanri.instance.recovery_plan import RecoveryPlan
from kanri.instance.restore import (
    BackupInfo,
    RestoreError,
    choose_backup,
    recovery_parameters,
    restore_wal,
    systems,
)
from kanri.postgres.backup import plan as backup_plan
from kanri.postgres.backup.archiving import server_name, upgraded_server_name
from kanri.postgres.backup.schedule import due

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
SOURCE = ArchiveTarget(destination="s3://bk/p", endpointURL="http://s3:8333", serverName="up")


def _cluster(backup: dict[str, object] | None = None, phase: str = "Ready") -> dict[str, object]:
    status: dict[str, object] = {"phase": phase}
    if backup is not None:
        status["backup"] = backup
    return {"metadata": {"name": "up", "namespace": "ns"}, "status": status}


def test_the_first_system_archives_under_the_clusters_name_an_upgraded_one_under_its_own() -> None:
    assert server_name(_cluster()) == "up"
    assert upgraded_server_name("up", 15) == "up.pg15"
    assert server_name(_cluster({"serverName": "up.pg15"})) == "up.pg15"


def test_the_instance_accepts_an_upgraded_systems_server_name_and_nothing_looser() -> None:
    for good in ("up", "up.pg15", "a-b.pg18"):
        assert ArchiveTarget.model_validate({**SOURCE.model_dump(by_alias=True), "serverName": good})
    for bad in ("up.x", "up.pg15.pg16", "../up", "up/pg15", "Up"):
        with pytest.raises(ValidationError):
            ArchiveTarget.model_validate({**SOURCE.model_dump(by_alias=True), "serverName": bad})


def test_after_an_upgrade_the_schedule_asks_for_the_new_systems_first_backup() -> None:
    # the upgrade cleared lastScheduled and set the server name: the next Ready pass asks for a first backup again,
    # named for the new system (the old "<cluster>-initial" exists and would only answer 409)
    assert due(_cluster({"serverName": "up.pg15"}), "0 0 * * *", NOW) == ("up-pg15-initial", NOW, "initial")
    assert due(_cluster(), "0 0 * * *", NOW) == ("up-initial", NOW, "initial")
    assert due(_cluster({"serverName": "up.pg15"}, phase="Upgrading"), "0 0 * * *", NOW) is None


def _backup(name: str, ended: str, server: str | None) -> dict[str, object]:
    status: dict[str, object] = {"phase": "Completed", "backupId": name[-15:], "completedAt": ended}
    if server is not None:
        status["serverName"] = server
    return {"metadata": {"name": name}, "status": status}


def test_retention_knows_which_folder_each_backup_is_in() -> None:
    done = backup_plan.completed([
        _backup("up-initial-20261101T000000", "2026-11-01T00:05:00Z", None),  # recorded before serverName was
        _backup("up-sched-20261115T000000", "2026-11-15T00:05:00Z", "up"),
        _backup("up-pg15-i-20261120T000000", "2026-11-20T00:05:00Z", "up.pg15"),
    ], "up")  # fmt: skip
    assert [d.server for d in done] == ["up", "up", "up.pg15"]
    # the window runs across both systems: the old system's backups expire too (each in its own folder)
    old = backup_plan.expired(done, 7, NOW)
    assert [(d.server, d.backup_id) for d in old] == [("up", "20261101T000000"), ("up", "20261115T000000")]


def _info(backup_id: str, end: str, server: str, major: int | None) -> BackupInfo:
    return BackupInfo(backup_id, "DONE", None, datetime.fromisoformat(end), "0/5000100", 1, True, major, server)


OLD = _info("20261101T000000", "2026-11-01T00:05:00+00:00", "up", 14)
NEW = _info("20261120T000000", "2026-11-20T00:05:00+00:00", "up.pg15", 15)


def _plan(**fields: object) -> RecoveryPlan:
    return RecoveryPlan.model_validate({"source": SOURCE.model_dump(by_alias=True), **fields})


def test_a_restore_looks_in_the_sources_folder_and_in_that_of_the_system_an_upgrade_to_its_major_made() -> None:
    assert [t.server_name for t in systems(SOURCE, 15)] == ["up", "up.pg15"]
    upgraded = ArchiveTarget.model_validate({**SOURCE.model_dump(by_alias=True), "serverName": "up.pg15"})
    assert [t.server_name for t in systems(upgraded, 15)] == ["up.pg15"]
    assert [t.server_name for t in systems(SOURCE, None)] == ["up"]


def test_only_a_backup_of_the_restoring_major_is_chosen_and_the_error_names_the_others() -> None:
    assert choose_backup([NEW, OLD], _plan(), 15) == NEW
    assert choose_backup([NEW, OLD], _plan(), 14) == OLD
    # before the upgrade only the 14 system has a backup: a 15 restore says so, a 14 restore takes it
    with pytest.raises(RestoreError, match="backups of 14 are there too"):
        choose_backup([NEW, OLD], _plan(targetTime="2026-11-10T00:00:00Z"), 15)
    assert choose_backup([NEW, OLD], _plan(targetTime="2026-11-10T00:00:00Z"), 14) == OLD
    unknown = dataclasses.replace(OLD, major=None)  # a listing without barman's version: not filtered out
    assert choose_backup([unknown], _plan(), 15) == unknown


def test_the_wal_comes_from_the_folder_the_chosen_backup_is_in() -> None:
    plain = recovery_parameters(_plan(), "recovery", python="/py")["restore_command"]
    assert plain == "/py -m kanri.instance restore-wal recovery %f %p"
    moved = recovery_parameters(_plan(), "recovery", python="/py", server="up.pg15")["restore_command"]
    assert moved == "/py -m kanri.instance restore-wal recovery %f %p up.pg15"


def _config(tmp_path: Path) -> dict[str, str]:
    raw = json.dumps({"recovery": {"source": SOURCE.model_dump(by_alias=True)}})
    (tmp_path / "instance.json").write_text(raw)
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "ACCESS_KEY_ID").write_text("id")
    (keys / "ACCESS_SECRET_KEY").write_text("secret")
    barman = tmp_path / "bin"
    barman.mkdir()
    fake = barman / "barman-cloud-wal-restore"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "argv"}\n')  # records what it was asked
    fake.chmod(0o755)
    return {"KANRI_CONFIG_FILE": str(tmp_path / "instance.json"), "KANRI_RECOVERY_CREDENTIALS_DIR": str(keys),
            "KANRI_BARMAN_BIN": str(barman), "PATH": "/usr/bin:/bin"}  # fmt: skip


def test_restore_wal_reads_the_chosen_systems_folder_and_never_another_clusters(tmp_path: Path) -> None:
    env = _config(tmp_path)
    assert restore_wal("recovery", "000000010000000000000003", "pg_wal/x", env, server="up.pg15") == 0
    assert " up.pg15 000000010000000000000003 " in (tmp_path / "argv").read_text()
    (tmp_path / "argv").unlink()
    assert restore_wal("recovery", "000000010000000000000003", "pg_wal/x", env, server="billing.pg15") == 1
    assert restore_wal("recovery", "000000010000000000000003", "pg_wal/x", env, server="up.x") == 1
    assert not (tmp_path / "argv").exists()  # barman never ran for them
