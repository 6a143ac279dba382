"""A full data volume, for real: an instance manager and PostgreSQL 15 with PGDATA on a size-enforced ext4 filesystem
(a loop-mounted image), filled with INSERTs until PostgreSQL fails with ENOSPC. The instance must report ``DiskFull``
with the volume's free bytes; once space returns it must start writing again by itself, with every row the client
was told was committed still there. Space returns by removing a file beside PGDATA: growing the filesystem online
(``resize2fs`` on the mounted loop device) needs CAP_SYS_RESOURCE, which the test machine's container lacks; to
PostgreSQL and the instance manager both are the same, free blocks appearing on a mounted volume.

Needs root (mount, losetup) and the PostgreSQL binaries; the loop device is detached and the mount removed in a
``finally``, whatever happens.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from kanri.instance.disk_full import WAL_SEGMENT, room_needed
from tests.integration.test_instance_manager import (
    CLUSTER,
    PG_BIN,
    Instance,
    Workspace,
    _cleanup,
    chown_tree,
    postmasters,
)
from tests.support import eventually

pytestmark = [
    pytest.mark.skipif(not (PG_BIN / "postgres").exists(), reason=f"no PostgreSQL binaries in {PG_BIN}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a loop device needs root"),
    pytest.mark.skipif(not (shutil.which("mkfs.ext4") and shutil.which("losetup")), reason="no mkfs.ext4/losetup"),
    pytest.mark.timeout(120),
]

IMAGE_BYTES = 160 * 1024 * 1024
LEFT_FOR_ROWS = 40 * 1024 * 1024
"""What the ballast leaves PostgreSQL once it runs: a few seconds of INSERTs."""
ROWS_PER_INSERT = 400
FREE = re.compile(r"(\d+) bytes free of (\d+)")


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


@dataclass
class LoopVolume:
    """An ext4 image mounted on ``mountpoint`` through a loop device (no blocks reserved for root: the figure
    statvfs gives PostgreSQL is the whole free space)."""

    image: Path
    mountpoint: Path

    def mount(self) -> None:
        with open(self.image, "wb") as image:
            image.truncate(IMAGE_BYTES)
        made = run("mkfs.ext4", "-q", "-F", "-m", "0", str(self.image))
        assert made.returncode == 0, made.stderr
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        mounted = run("mount", "-o", "loop", str(self.image), str(self.mountpoint))
        assert mounted.returncode == 0, mounted.stderr

    def release(self) -> list[str]:
        """Unmount and detach, whatever state things are in; what could not be undone."""
        left: list[str] = []
        if os.path.ismount(self.mountpoint) and run("umount", str(self.mountpoint)).returncode != 0:
            lazy = run("umount", "-l", str(self.mountpoint))
            left.append(f"umount needed -l ({lazy.returncode})")
        for line in run("losetup", "-j", str(self.image)).stdout.splitlines():
            device = line.split(":", 1)[0]
            if run("losetup", "-d", device).returncode != 0:
                left.append(f"{device} not detached")
        return left

    def attached(self) -> str:
        return run("losetup", "-j", str(self.image)).stdout.strip()

    def mounted(self) -> bool:
        return os.path.ismount(self.mountpoint)

    def leave_free(self, left: int) -> None:
        """A file of root's beside PGDATA takes all but ``left`` bytes (someone else's data on the same volume)."""
        stat = os.statvfs(self.mountpoint)
        with open(self.mountpoint / "ballast", "wb") as out:
            os.posix_fallocate(out.fileno(), 0, stat.f_bavail * stat.f_frsize - left)

    def free_ballast(self) -> None:
        (self.mountpoint / "ballast").unlink()


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kanri-diskfull-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest_asyncio.fixture(loop_scope="session")
async def full_volume(root: Path) -> AsyncIterator[tuple[Instance, LoopVolume]]:
    chown_tree(root, recursive=False)  # the instance user passes through it
    workspace = Workspace(root / "ws")
    workspace.root.mkdir()
    workspace.write_secrets()
    workspace.write_config({}, [f"{CLUSTER}-1"])
    chown_tree(workspace.root)
    instance = Instance(workspace, f"{CLUSTER}-1", "primary")
    volume = LoopVolume(root / "volume.img", instance.root / "volume")
    try:
        volume.mount()
        chown_tree(volume.mountpoint, recursive=False)
        await instance.start()
        await instance.wait_ready()
        yield instance, volume
    finally:
        await _cleanup(instance)
        for pid in postmasters(instance.pgdata):  # a postmaster the manager could not stop holds the mount
            os.kill(int(pid), 9)
        left = volume.release()
        assert (left, volume.attached(), volume.mounted()) == ([], "", False)


async def fill(instance: Instance, acknowledged: list[int]) -> str:
    """INSERT until PostgreSQL refuses for lack of space; the ids of every statement that returned are kept."""
    async with await instance.connect() as conn:
        await conn.execute("CREATE TABLE filler (id int PRIMARY KEY, pad text)")
    next_id = 0
    for _ in range(500):
        ids = range(next_id, next_id + ROWS_PER_INSERT)
        try:
            async with await instance.connect() as conn:
                # 1,920 random hex characters a row: stored inline, not compressed away
                await conn.execute(
                    "INSERT INTO filler SELECT i, (SELECT string_agg(md5(random()::text || g || i), '') "
                    "FROM generate_series(1, 60) g) FROM generate_series(%s::int, %s::int) i",
                    (ids.start, ids.stop - 1),
                )
        except psycopg.Error as error:
            return str(error)
        acknowledged.extend(ids)
        next_id = ids.stop
    raise AssertionError(f"{len(acknowledged)} rows went in and the volume never filled")


async def disk_full_problem(instance: Instance) -> dict[str, Any] | None:
    body = await instance.status()
    return next((p for p in body["problems"] if p["reason"] == "DiskFull"), None)


async def test_a_full_volume_is_reported_with_its_free_bytes_and_recovers_once_space_returns_with_no_row_lost(
    full_volume: tuple[Instance, LoopVolume], record_property: Callable[[str, object], None]
) -> None:
    instance, volume = full_volume
    volume.leave_free(LEFT_FOR_ROWS)

    acknowledged: list[int] = []
    refused = await fill(instance, acknowledged)
    assert "No space left on device" in refused or "terminat" in refused or "connection" in refused, refused

    problem: dict[str, Any] | None = None

    async def reported() -> bool:
        # the volume's statvfs and PostgreSQL's log line reach the manager separately: with under 1 MiB left the
        # problem is up before the line is read, and names PostgreSQL's failure a check later
        nonlocal problem
        problem = await disk_full_problem(instance)
        return problem is not None and "No space left on device" in problem["message"]

    try:
        await eventually(reported, timeout=30, interval=0.5)
    except TimeoutError:
        last = await instance.status()
        raise AssertionError(f"no DiskFull naming PostgreSQL's failure; last /status: {last}") from None
    assert problem is not None
    found = FREE.search(problem["message"])
    assert found, problem
    told_free, told_size = int(found[1]), int(found[2])
    now = os.statvfs(volume.mountpoint)
    assert told_size == now.f_blocks * now.f_frsize
    assert abs(told_free - now.f_bavail * now.f_frsize) <= WAL_SEGMENT, (problem, now.f_bavail * now.f_frsize)
    assert told_free < room_needed(told_size)

    record_property("disk_full_message", problem["message"])
    record_property("refused_with", refused.splitlines()[0])
    volume.free_ballast()  # space returns (someone removed their files); nobody restarts anything
    freed = time.monotonic()

    async def recovered() -> bool:
        if await disk_full_problem(instance) is not None:
            return False
        try:
            async with await instance.connect() as conn:
                await conn.execute("INSERT INTO filler VALUES (-1, 'after') ON CONFLICT (id) DO NOTHING")
        except psycopg.Error:
            return False
        return True

    try:
        await eventually(recovered, timeout=45, interval=0.5)
    except TimeoutError:
        raise AssertionError(f"not recovered; last /status: {await instance.status()}") from None
    record_property("seconds_to_write_again", round(time.monotonic() - freed, 1))
    record_property("restarts", (await instance.status())["restartCount"])
    # every statement that returned was told "committed"; the ids are 0..n-1 and the refused statement's come after
    assert acknowledged, "not one INSERT went in before the volume filled"
    ((kept,),) = await instance.query(f"SELECT count(*) FROM filler WHERE id BETWEEN 0 AND {max(acknowledged)}")
    assert kept == len(acknowledged), f"{len(acknowledged) - kept} of {len(acknowledged)} acknowledged rows lost"
