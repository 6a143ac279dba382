"""Retention over the whole repository (kanri.postgres.backup.catalogue, issue 29 item 5): backups no PostgresBackup
records count, only complete ones, and a restore under way keeps the backup it needs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from kanri.contract.backup import Catalogue, CatalogueEntry
from kanri.instance.base_backup import catalogue_entries
from kanri.postgres.backup.catalogue import needed_by_restores, unrecorded
from kanri.postgres.backup.plan import Done, expired

NOW = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)


def entry(backup_id: str, days_ago: float, status: str = "DONE") -> CatalogueEntry:
    return CatalogueEntry(backup_id=backup_id, status=status, end_time=(NOW - timedelta(days=days_ago)).isoformat())


def test_only_complete_backups_no_postgresbackup_records_are_added() -> None:
    recorded = [Done("db-manual", "20261205T100000", NOW - timedelta(days=2), "db")]
    entries = [entry("20261201T100000", 6), entry("20261205T100000", 2), entry("20261206T100000", 1, "FAILED"),
               CatalogueEntry(backup_id="20261206T110000", status="STARTED"), entry("20261203T100000", 4)]  # fmt: skip
    found = unrecorded(entries, "db", recorded)
    assert [(d.name, d.backup_id, d.server) for d in found] == [("", "20261201T100000", "db"),
                                                                ("", "20261203T100000", "db")]  # fmt: skip
    # a backup of the same id recorded under another system is another backup
    assert [d.backup_id for d in unrecorded([entry("20261205T100000", 2)], "db.pg16", recorded)] == ["20261205T100000"]


def test_retention_expires_an_unrecorded_backup_outside_the_window_and_keeps_the_ones_the_window_needs() -> None:
    recorded = [Done("db-new", "20261207T090000", NOW - timedelta(hours=1), "db")]
    orphans = unrecorded([entry("20261201T100000", 6), entry("20261204T100000", 3), entry("20261206T100000", 1)],
                         "db", recorded)  # fmt: skip
    old = expired([*recorded, *orphans], 2, NOW)
    # 3 days old is the newest before the 2-day window (its base): kept, as is the one inside the window
    assert [d.backup_id for d in old] == ["20261201T100000"]


def cluster(recovery: dict[str, object], restored: bool = False) -> dict[str, object]:
    status = {"systemIdentifier": "7000000000000000001"} if restored else {}
    return {"metadata": {"name": "copy"}, "spec": {"bootstrap": {"recovery": recovery}}, "status": status}


def test_a_restore_under_way_keeps_the_backup_it_needs() -> None:
    backups = [Done("", "20261201T100000", NOW - timedelta(days=6), "db"),
               Done("", "20261203T100000", NOW - timedelta(days=4), "db"),
               Done("b", "20261206T100000", NOW - timedelta(days=1), "db")]  # fmt: skip
    named = cluster({"source": "db", "backup": "20261201T100000"})
    timed = cluster({"source": "db", "targetTime": (NOW - timedelta(days=3)).isoformat()})
    latest = cluster({"source": "db"})
    assert needed_by_restores([named, timed, latest], "db", backups) == {"20261201T100000", "20261203T100000",
                                                                         "20261206T100000"}  # fmt: skip
    # finished restores, and restores of another source, need nothing of it
    assert (
        needed_by_restores(
            [
                cluster({"source": "db", "backup": "20261201T100000"}, restored=True),
                cluster({"source": "other", "backup": "20261201T100000"}),
            ],
            "db",
            backups,
        )
        == set()
    )
    assert needed_by_restores([cluster({"source": "db", "targetTime": (NOW - timedelta(days=9)).isoformat()})],
                              "db", backups) == set()  # fmt: skip


def test_barmans_json_catalogue_is_read_and_a_foreign_body_is_no_catalogue() -> None:
    listed = {"backups_list": [
        {"backup_id": "20261201T100000", "status": "DONE", "end_time_iso": "2026-12-01T10:00:05.123456+00:00",
         "end_time": "Tue Dec  1 10:00:05 2026", "backup_name": "uid-1"},
        {"backup_id": "20261202T100000", "status": "FAILED", "end_time_iso": None},
        {"status": "DONE"},
    ]}  # fmt: skip
    entries = catalogue_entries(json.dumps(listed))
    assert [(e.backup_id, e.status, e.name) for e in entries] == [("20261201T100000", "DONE", "uid-1"),
                                                                  ("20261202T100000", "FAILED", None)]  # fmt: skip
    assert entries[0].end_time is not None
    assert unrecorded(entries, "db", [])[0].ended == datetime(
        2026, 12, 1, 10, 0, 5, tzinfo=UTC
    )  # to the second, as records are
    read = Catalogue.read(Catalogue(backups=entries).as_json())
    assert read is not None
    assert read.backups == entries
    assert Catalogue.read({"backups": "all"}) is None
    assert Catalogue.read([]) is None
