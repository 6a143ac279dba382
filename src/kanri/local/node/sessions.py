"""Container sessions: every container's launcher (its shim) leads a session of its own (the kubelet starts it
with ``start_new_session``), and the container's processes inherit that session unless they ``setsid`` (their PID
namespace and cgroup still end them). The node records each session id so that ``kanri local down`` can prove no
container process outlived the node, even after a crash."""

from __future__ import annotations

from pathlib import Path

CONTAINER_SESSIONS = "container-sessions"
"""File in the node's data dir: one session id (the container process's pid) per line."""


def container_processes(data_dir: Path) -> list[int]:
    """Live processes in a session the node recorded for a container."""
    try:
        sessions = {int(line) for line in (data_dir / CONTAINER_SESSIONS).read_text().split()}
    except FileNotFoundError:
        return []
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields: state ppid pgrp session ...; a zombie has already exited.
        if fields[0] != "Z" and int(fields[3]) in sessions:
            alive.append(int(entry.name))
    return sorted(alive)


def record_session(data_dir: Path, pid: int) -> None:
    """Remember a container process's session (its pid) for :func:`container_processes`."""
    with (data_dir / CONTAINER_SESSIONS).open("a") as f:
        f.write(f"{pid}\n")


def forget_sessions(data_dir: Path) -> None:
    """After a clean stop: nothing of the recorded sessions runs any more."""
    if not container_processes(data_dir):
        (data_dir / CONTAINER_SESSIONS).unlink(missing_ok=True)
