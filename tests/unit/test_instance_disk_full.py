"""DiskFull on the instance side: PostgreSQL's ENOSPC lines recognised (and nothing else), the decision against the
volume's free bytes, the figure kept steady, the wake-up when space returns, and the log passed through unchanged."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from kanri.contract.problems import REASONS
from kanri.contract.status import InstanceStatus
from kanri.instance.disk_full import (
    DISK_FULL,
    EMPTY_BELOW,
    DiskWatch,
    VolumeSpace,
    disk_full_problems,
    enospc_failure,
    read_space,
    room_needed,
)
from kanri.instance.postgres_log import MAX_LINE, LogPipe, split_lines
from kanri.instance.problems import ProblemLog

MIB = 1024 * 1024
SIZE = 1000 * MIB

# As PostgreSQL 15 prints them (log_line_prefix '%m [%p] ').
EXTEND = '2026-12-06 21:30:01.123 UTC [812] ERROR:  could not extend file "base/16384/16385": No space left on device\n'
WAL = '2026-12-06 21:30:02.456 UTC [812] PANIC:  could not write to file "pg_wal/xlogtemp.812": No space left on device'
LOCKFILE = 'FATAL:  could not write lock file "postmaster.pid": No space left on device'


def test_postgres_enospc_messages_are_recognised_with_what_failed() -> None:
    assert enospc_failure(EXTEND) == 'could not extend file "base/16384/16385"'
    assert enospc_failure(WAL) == 'could not write to file "pg_wal/xlogtemp.812"'
    assert enospc_failure(LOCKFILE) == 'could not write lock file "postmaster.pid"'


@pytest.mark.parametrize(
    "line",
    [
        # log_statement quotes SQL: a row's text must never be taken for (or copied into) a problem
        "2026-12-06 LOG:  statement: INSERT INTO t VALUES ('could not write: No space left on device')",
        "2026-12-06 STATEMENT:  INSERT INTO t VALUES ('x')",
        "2026-12-06 HINT:  Check free disk space.",
        '2026-12-06 ERROR:  could not extend file "base/1/2": Permission denied',
        "",
    ],
)
def test_other_lines_are_not_enospc(line: str) -> None:
    assert enospc_failure(line) is None


def space(free: int, size: int = SIZE) -> VolumeSpace:
    return VolumeSpace("/data/pgdata", free, size)


def test_the_decision_needs_postgres_failing_and_the_volume_short_or_nothing_left_at_all() -> None:
    failure = 'could not extend file "base/16384/16385"'
    assert room_needed(SIZE) == 32 * MIB  # two WAL segments beat 2% of 1000 MiB
    assert room_needed(100 * 1024 * MIB) == 2 * 1024 * MIB  # 2% of 100 GiB
    (full,) = disk_full_problems(space(9 * MIB), failure)
    assert full.reason == DISK_FULL
    assert full.message.startswith(f"data volume full: {9 * MIB} bytes free of {SIZE} (9.0 MiB of 1000.0 MiB")
    assert f"PostgreSQL: {failure}: No space left on device" in full.message
    assert "once 32.0 MiB are free" in full.message
    # a failure but room (the space came back), or a low volume with no failure (that is for the alerts): nothing
    assert disk_full_problems(space(40 * MIB), failure) == []
    assert disk_full_problems(space(9 * MIB), None) == []
    # nothing left at all is full before PostgreSQL says so
    (empty,) = disk_full_problems(space(EMPTY_BELOW - 1), None)
    assert "PostgreSQL:" not in empty.message
    assert disk_full_problems(None, failure) == []  # no volume yet (a replica cloning)


def test_the_problem_passes_through_the_contract_under_its_own_reason() -> None:
    (problem,) = disk_full_problems(space(9 * MIB), 'could not write to file "pg_wal/xlogtemp.812"')
    assert DISK_FULL in REASONS
    body = {"name": "db-1", "role": "primary", "problems": [problem.as_json()]}
    read = InstanceStatus.read(body)
    assert read is not None
    assert [(p.reason, p.message) for p in read.problems] == [(DISK_FULL, problem.message)]
    assert len(problem.message) <= 300


class Volume:
    """What statvfs answers, set by the test."""

    def __init__(self, free: int) -> None:
        self.free = free

    def __call__(self, path: Path) -> VolumeSpace:
        return VolumeSpace(str(path), self.free, SIZE)


def test_the_watch_reports_keeps_its_figure_steady_and_clears_when_space_returns() -> None:
    volume = Volume(9 * MIB)
    watch = DiskWatch(Path("/data/pgdata"), read=volume)
    log = ProblemLog()
    assert watch.check() == []
    assert watch.room.is_set()
    watch.saw_line(EXTEND)
    watch.saw_line(WAL.replace("812", "813"))  # a later failure does not change what is said
    (first,) = watch.check()
    assert 'could not extend file "base/16384/16385"' in first.message
    assert watch.full
    assert not watch.room.is_set()
    log.report(watch.SOURCE, [first])
    assert log.last_error == first.message
    volume.free = 8 * MIB  # PostgreSQL restarted and took a little: the same message, not a new Event
    assert watch.check() == [first]
    volume.free = 100 * MIB  # a claim grown, or files removed
    assert watch.check() == []
    assert not watch.full
    assert watch.room.is_set()
    log.report(watch.SOURCE, [])
    assert log.last_error is None
    volume.free = 9 * MIB  # low again, but PostgreSQL has not failed since: not full
    assert watch.check() == []


def test_a_large_move_of_the_free_space_is_told() -> None:
    volume = Volume(20 * MIB)
    watch = DiskWatch(Path("/data/pgdata"), read=volume)
    watch.saw_line(EXTEND)
    (before,) = watch.check()
    volume.free = 1 * MIB + 512 * 1024
    (after,) = watch.check()
    assert f"{volume.free} bytes free" in after.message
    assert after != before


async def test_the_back_off_ends_when_space_returns_and_runs_its_course_otherwise() -> None:
    volume = Volume(9 * MIB)
    watch = DiskWatch(Path("/data/pgdata"), read=volume)
    watch.saw_line(WAL)
    assert watch.check()
    started = time.monotonic()
    paused = asyncio.create_task(watch.pause(30))
    await asyncio.sleep(0.05)
    assert not paused.done()
    volume.free = 100 * MIB
    watch.check()
    await asyncio.wait_for(paused, 5)
    assert time.monotonic() - started < 5
    started = time.monotonic()
    await watch.pause(0.1)  # room: an ordinary sleep
    assert time.monotonic() - started >= 0.1


def test_read_space_is_statvfs_for_an_unprivileged_writer(tmp_path: Path) -> None:
    found = read_space(tmp_path)
    assert found is not None
    stat = os.statvfs(tmp_path)
    assert found.size_bytes == stat.f_blocks * stat.f_frsize
    assert 0 <= found.free_bytes <= found.size_bytes
    assert read_space(tmp_path / "missing") is None


async def test_the_log_passes_through_unchanged_and_every_line_reaches_the_watcher(tmp_path: Path) -> None:
    seen: list[str] = []
    watch = DiskWatch(tmp_path, read=Volume(9 * MIB))

    def broken(line: str) -> None:
        raise RuntimeError("a watcher's bug")

    out_read, out_write = os.pipe()
    pipe = LogPipe([seen.append, broken, watch.saw_line], out=out_write)  # out: the container log
    process = await asyncio.create_subprocess_exec(
        "sh", "-c", f"printf 'first\\n%s\\nno newline at the end' '{EXTEND.strip()}' >&2", stdout=pipe.write_fd,
        stderr=pipe.write_fd,
    )  # fmt: skip
    try:
        pipe.start()
        assert await process.wait() == 0
        await asyncio.to_thread(pipe.thread.join, 5)
        assert not pipe.thread.is_alive()
    finally:
        os.close(out_write)
    with os.fdopen(out_read, "rb") as passed:
        assert passed.read() == f"first\n{EXTEND.strip()}\nno newline at the end".encode()
    assert seen == ["first\n", EXTEND, "no newline at the end"]
    assert watch.failure == 'could not extend file "base/16384/16385"'


def test_lines_are_split_across_reads_and_a_runaway_line_is_handed_on_in_pieces() -> None:
    assert split_lines(b"", b"one\ntw") == ([b"one\n"], b"tw")
    assert split_lines(b"tw", b"o\n\nthree\r\n") == ([b"two\n", b"\n", b"three\r\n"], b"")
    huge = b"x" * (MAX_LINE + 1)
    assert split_lines(b"", huge) == ([huge], b"")


def test_the_steady_figure_never_decides_only_the_volume_does() -> None:
    volume = Volume(EMPTY_BELOW // 2)  # nothing left: full before PostgreSQL says so
    watch = DiskWatch(Path("/data/pgdata"), read=volume)
    assert watch.check()
    volume.free = 10 * MIB  # within a WAL segment of the figure told, but above the empty mark and no failure
    assert watch.check() == []
    assert watch.room.is_set()
