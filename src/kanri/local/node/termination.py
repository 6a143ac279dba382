"""Termination messages, as the kubelet gives them: the file a container writes at its ``terminationMessagePath``
(default ``/dev/termination-log``) becomes its terminated state's ``message`` (at most 4096 bytes); with
``terminationMessagePolicy: FallbackToLogsOnError`` an empty file and a failed exit give the log's tail instead (at
most 80 lines, 2048 bytes). One-off pods (a restore rehearsal, a major upgrade's check) report their verdicts so.

Each container gets its own host file, emptied at every start and bound read-write at the path (the launcher
creates the mountpoint in the container's own ``/dev``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_PATH", "FILE_LIMIT", "LOG_LIMIT", "LOG_LINES", "fresh_file", "message", "target"]

DEFAULT_PATH = "/dev/termination-log"
FILE_LIMIT = 4096
LOG_LIMIT = 2048
LOG_LINES = 80


def target(container: dict[str, Any]) -> str:
    """Where the container sees its termination-message file."""
    return str(container.get("terminationMessagePath") or DEFAULT_PATH)


def fresh_file(pod_dir: Path, container: str) -> Path:
    """The container's (empty) host file; writable by whichever user the container runs as."""
    path = pod_dir / "termination" / container
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    os.chmod(path, 0o666)
    return path


def message(container: dict[str, Any], written: Path, exit_code: int, log: Path | None) -> str:
    """The terminated state's message (see the module docstring); empty when there is none."""
    try:
        with written.open("rb") as handle:
            text = handle.read(FILE_LIMIT).decode(errors="replace")
    except OSError:
        text = ""
    if text.strip() or exit_code == 0 or container.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        return text
    if log is None:
        return ""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - 64 * 1024))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return ""
    lines = tail.splitlines()[-LOG_LINES:]
    return "\n".join(lines)[-LOG_LIMIT:]
