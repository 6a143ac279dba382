"""The old timeline's segments a promoted standby holds are marked for archiving (kanri.instance.archive_gap)."""

from __future__ import annotations

from pathlib import Path

from kanri.instance.archive_gap import mark_old_timeline_ready


def _pg_wal(tmp_path: Path, files: dict[str, str | None]) -> Path:
    """pg_wal with ``files`` (name -> archive status suffix, or None for no status file)."""
    wal = tmp_path / "pg_wal"
    (wal / "archive_status").mkdir(parents=True)
    for name, mark in files.items():
        (wal / name).write_bytes(b"")
        if mark is not None:
            (wal / "archive_status" / f"{name}.{mark}").write_bytes(b"")
    return wal


def test_only_done_files_of_older_timelines_still_in_pg_wal_are_marked_ready(tmp_path: Path) -> None:
    wal = _pg_wal(tmp_path, {
        "000000010000000000000004": "done",  # streamed, maybe never archived by the old primary: again
        "000000010000000000000005": "done",
        "000000010000000000000006.partial": "ready",  # PostgreSQL's own, left alone
        "00000002.history": "ready",
        "000000020000000000000006": None,  # the new timeline's: PostgreSQL's business
        "000000010000000000000003": "ready",  # already waiting
    })  # fmt: skip
    (wal / "archive_status" / "000000010000000000000002.done").write_bytes(b"")  # its segment is gone
    (wal / "archive_status" / "000000020000000000000005.done").write_bytes(b"")  # the new timeline: untouched

    marked = mark_old_timeline_ready(tmp_path, 2)

    assert marked == ["000000010000000000000004", "000000010000000000000005"]
    status = sorted(p.name for p in (wal / "archive_status").iterdir())
    assert status == [
        "000000010000000000000002.done",
        "000000010000000000000003.ready",
        "000000010000000000000004.ready",
        "000000010000000000000005.ready",
        "000000010000000000000006.partial.ready",
        "00000002.history.ready",
        "000000020000000000000005.done",
    ]


def test_history_files_of_older_timelines_are_marked_too_and_no_pg_wal_marks_nothing(tmp_path: Path) -> None:
    _pg_wal(tmp_path, {"00000002.history": "done", "00000003.history": "done"})
    assert mark_old_timeline_ready(tmp_path, 3) == ["00000002.history"]
    assert mark_old_timeline_ready(tmp_path / "elsewhere", 3) == []
