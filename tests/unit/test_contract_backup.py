"""kanri.contract.backup: a backup id's record, an expiry's and a WAL switch's answers keep the keys (and their order)
instances have always sent, old records on a volume still read, and the operator reads them defensively."""

from __future__ import annotations

import json
from typing import Any

from kanri.contract.backup import BackupRecord, Expired, WalSwitched
from kanri.instance.base_backup import apply_show

# A completed record as kanri.instance.base_backup wrote it (to the volume and to GET /backups/{id}) at 0ec1969.
BEFORE: dict[str, Any] = {
    "id": "3f0c6b1e-0d7c-4b43-9a57-4c0e6f1f6d2a", "phase": "Completed", "startedAt": "2026-12-06T06:00:00+00:00",
    "completedAt": "2026-12-06T06:00:09+00:00", "backupId": "20261206T060001",
    "beginTime": "2026-12-06T06:00:01+00:00", "endTime": "2026-12-06T06:00:08+00:00",
    "beginWal": "000000010000000000000004", "endWal": "000000010000000000000004", "beginLsn": "0/4000028",
    "endLsn": "0/4000138", "sizeBytes": 31457280, "timeline": 1, "fromStandby": True, "error": None,
}  # fmt: skip


def test_a_record_is_sent_and_kept_as_before_the_contract() -> None:
    record = BackupRecord.model_validate(BEFORE)  # a record an older manager left on the volume
    assert json.dumps(record.as_json()) == json.dumps(BEFORE)
    assert (record.backup_id, record.size_bytes, record.from_standby) == ("20261206T060001", 31457280, True)


def test_a_running_record_is_filled_from_barmans_show_in_place() -> None:
    record = BackupRecord(id="b-1", phase="Running", started_at="2026-12-06T06:00:00+00:00", from_standby=False)
    apply_show(record, {"backup_id": "20261206T060001", "begin_wal": "000000010000000000000004", "size": 42,
                        "timeline": True, "begin_xlog": 5})  # fmt: skip
    assert (record.backup_id, record.size_bytes) == ("20261206T060001", 42)
    assert record.begin_wal == "000000010000000000000004"
    assert (record.timeline, record.begin_lsn) == (None, None)  # wrong types from barman are dropped
    sent = record.as_json()
    assert list(sent) == list(BEFORE)
    assert (sent["phase"], sent["error"], sent["fromStandby"]) == ("Running", None, False)


def test_the_operator_reads_a_record_defensively() -> None:
    assert BackupRecord.read(BEFORE) == BackupRecord.model_validate(BEFORE)
    odd = BackupRecord.read({"id": "b-1", "phase": "Failed", "error": " barman\n failed ", "sizeBytes": "1",
                             "fromStandby": "yes", "backupId": ""})  # fmt: skip
    assert odd is not None
    assert (odd.error, odd.size_bytes, odd.from_standby, odd.backup_id, odd.started_at) == (
        "barman failed", None, None, None, "")  # fmt: skip
    assert BackupRecord.read({"id": "b-1", "phase": "Lost"}) is None
    assert BackupRecord.read({"phase": "Running"}) is None
    assert BackupRecord.read(["b-1"]) is None


def test_expiry_and_wal_switch_answers() -> None:
    expired = {"deleted": ["20261206T060001"], "failed": {"20261205T060001": "barman: access denied"}}
    assert Expired(deleted=["20261206T060001"], failed={"20261205T060001": "barman: access denied"}).as_json() == (
        expired)  # fmt: skip
    assert Expired.read({"deleted": ["a", 5], "failed": "no"}) == Expired(deleted=["a"], failed={})
    assert Expired.read("nothing") is None
    assert WalSwitched(segment="000000010000000000000005").as_json() == {"segment": "000000010000000000000005"}
    assert WalSwitched.read({"segment": 5}) is None
