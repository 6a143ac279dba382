"""A node's cgroup: one directory of the same name in every cgroup hierarchy of the machine.

The node's daemons join it before they start anything, and the kubelet uses it as its ``cgroupRoot`` (its pods'
cgroups are made below it), so every process of the node — kubelet, containerd, shims, containers — is inside it.
That makes a stop exact: freeze the subtree (nothing can fork away), SIGKILL every member, thaw, remove the
directories bottom-up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


class CgroupError(RuntimeError):
    """The node's processes would not die, or a cgroup directory would not go."""


def hierarchies() -> list[Path]:
    """The mount point of every cgroup (v1) and cgroup2 hierarchy of this mount namespace."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fstype = after.split()[0] if after else ""
        if fstype in {"cgroup", "cgroup2"}:
            mounts.append(Path(before.split()[4]))
    return mounts


def node_dirs(name: str) -> list[Path]:
    """The node's cgroup directory in each hierarchy (existing or not)."""
    return [mount / name for mount in hierarchies()]


def create(name: str) -> None:
    """Create the node's cgroup in every hierarchy (idempotent)."""
    for directory in node_dirs(name):
        directory.mkdir(exist_ok=True)
    cpuset = Path("/sys/fs/cgroup/cpuset") / name
    if cpuset.is_dir():
        # a v1 cpuset cgroup admits no task until it names its cpus and memory nodes: inherit the parent's
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if not (cpuset / knob).read_text().strip():
                (cpuset / knob).write_text((cpuset.parent / knob).read_text())


def join(name: str, pid: int) -> None:
    """Move ``pid`` into the node's cgroup in every hierarchy (its children are born there)."""
    for directory in node_dirs(name):
        (directory / "cgroup.procs").write_text(f"{pid}\n")


def members(name: str) -> set[int]:
    """Every process in the node's cgroup subtree, in any hierarchy."""
    pids: set[int] = set()
    for top in node_dirs(name):
        if not top.is_dir():
            continue
        for directory, _, _ in os.walk(top):
            with contextlib.suppress(FileNotFoundError):
                pids.update(int(p) for p in (Path(directory) / "cgroup.procs").read_text().split())
    return pids


def set_frozen(name: str, frozen: bool) -> None:
    """Freeze (or thaw) every process of the node at once: the v1 freezer acts on the whole subtree."""
    state = Path("/sys/fs/cgroup/freezer") / name / "freezer.state"
    if state.exists():
        state.write_text("FROZEN\n" if frozen else "THAWED\n")


def is_frozen(name: str) -> bool:
    """Whether the node's freezer cgroup is frozen (or freezing)."""
    state = Path("/sys/fs/cgroup/freezer") / name / "freezer.state"
    return state.exists() and state.read_text().strip() != "THAWED"


def kill_all(name: str, timeout: float = 20.0) -> None:
    """SIGKILL every process of the node at once and wait until none is left."""
    deadline = time.monotonic() + timeout
    left: set[int] = set()
    while time.monotonic() < deadline:
        set_frozen(name, True)
        left = members(name)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        set_frozen(name, False)
        if not left:
            return
        time.sleep(0.05)
    raise CgroupError(f"processes of cgroup {name} survived SIGKILL for {timeout} s: {sorted(left)}")


def remove(name: str, timeout: float = 10.0) -> None:
    """Remove the node's cgroup directories, deepest first (call :func:`kill_all` first)."""
    deadline = time.monotonic() + timeout
    for top in node_dirs(name):
        if not top.is_dir():
            continue
        directories = [Path(d) for d, _, _ in os.walk(top)]
        for directory in sorted(directories, key=lambda p: len(p.parts), reverse=True):
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as error:  # EBUSY while an exiting task still counts
                    if time.monotonic() > deadline:
                        raise CgroupError(f"cannot remove {directory}: {error}") from error
                    time.sleep(0.05)


def leftovers(name: str) -> list[str]:
    """The node's cgroup directories that still exist (empty once it is stopped)."""
    return [f"cgroup {d}" for d in node_dirs(name) if d.is_dir()]
