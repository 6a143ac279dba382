"""What the reports say about the data, recorded on the claims, and read back."""

from __future__ import annotations

from typing import Any

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.cluster.recorded import (
    LAST_PRIMARY,
    PG_MAJOR,
    SYSTEM_IDENTIFIER,
    TIMELINE,
    annotation_patches,
    recorded_major,
    recorded_primary,
    recorded_system_identifier,
)

Obj = dict[str, Any]
SYSID = "7329117425863524378"


def claim(name: str, **annotations: str) -> Obj:
    return {"metadata": {"name": name, "annotations": annotations}}


def report(name: str, role: str = "replica", **extra: Any) -> InstanceReport:
    return InstanceReport(name=name, role=role, ready=True, running=True, **extra)


def test_a_reporting_primary_is_marked_and_the_old_mark_removed() -> None:
    claims = {"db-1": claim("db-1", **{LAST_PRIMARY: "true", TIMELINE: "1"}), "db-2": claim("db-2")}
    reports = {"db-1": report("db-1", data_version=16, system_identifier=SYSID),
               "db-2": report("db-2", "primary", timeline=2, data_version=16, system_identifier=SYSID)}  # fmt: skip
    patches = annotation_patches(claims, reports, "db-2")
    assert patches == {
        "db-1": {"metadata": {"annotations": {PG_MAJOR: "16", SYSTEM_IDENTIFIER: SYSID, LAST_PRIMARY: None,
                                              TIMELINE: None}}},
        "db-2": {"metadata": {"annotations": {PG_MAJOR: "16", SYSTEM_IDENTIFIER: SYSID, LAST_PRIMARY: "true",
                                              TIMELINE: "2"}}},
    }  # fmt: skip


def test_up_to_date_records_need_no_write_and_no_report_moves_no_mark() -> None:
    claims = {"db-1": claim("db-1", **{LAST_PRIMARY: "true", TIMELINE: "2", PG_MAJOR: "16"}), "db-2": claim("db-2")}
    assert annotation_patches(claims, {"db-1": report("db-1", "primary", timeline=2, data_version=16)}, "db-1") == {}
    assert annotation_patches(claims, {}, None) == {}  # stopped instances: the last knowledge stays
    assert annotation_patches(claims, {"db-2": report("db-2")}, None) == {}
    # the mark moves only to the confirmed primary, and only when it reports itself primary
    assert annotation_patches(claims, {"db-2": report("db-2")}, "db-2") == {}


def test_a_second_primary_never_takes_the_mark_whatever_its_timeline() -> None:
    claims = {"db-1": claim("db-1", **{LAST_PRIMARY: "true", TIMELINE: "1"}), "db-2": claim("db-2")}
    reports = {"db-1": report("db-1", "primary", timeline=1), "db-2": report("db-2", "primary", timeline=2)}
    assert annotation_patches(claims, reports, "db-1") == {}


def test_a_claim_being_deleted_is_not_written() -> None:
    deleting = {"metadata": {"name": "db-1", "deletionTimestamp": "2026-05-01T12:00:00Z"}}
    assert annotation_patches({"db-1": deleting}, {"db-1": report("db-1", "primary", data_version=15)}, "db-1") == {}


def test_records_are_read_back() -> None:
    claims = {"db-1": claim("db-1", **{PG_MAJOR: "15", SYSTEM_IDENTIFIER: SYSID}),
              "db-2": claim("db-2", **{LAST_PRIMARY: "true", TIMELINE: "3", PG_MAJOR: "15"}),
              "db-3": claim("db-3", **{LAST_PRIMARY: "true", TIMELINE: "2"})}  # fmt: skip
    assert recorded_primary(claims.values()) == "db-2"
    assert recorded_primary([claim("db-1")]) is None
    assert recorded_major(claims, "db-2") == 15
    assert recorded_major({"db-1": claim("db-1", **{PG_MAJOR: "16"}), "db-2": claim("db-2", **{PG_MAJOR: "15"})},
                          None) == 15  # fmt: skip
    assert recorded_major({"db-1": claim("db-1")}, "db-1") is None
    assert recorded_system_identifier(claims, "db-1") == SYSID
    assert recorded_system_identifier(claims, None) is None  # db-2, the last primary, has none recorded
