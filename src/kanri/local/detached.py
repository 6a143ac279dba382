"""A long-running local process started in a session of its own, found again through a pid file, that reports
readiness as a JSON line ``{"event": "ready", ...}`` (or ``{"event": "failed", "error": ...}``) in an events file.

The control plane and the local node agent are both run this way, so ``kanri local up`` can return while they keep
running and ``kanri local down`` can stop them from another process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_TAIL_LINES = 40


class DetachedProcessError(RuntimeError):
    """The process failed to start or stop; the message includes the tail of its log."""


class DetachedProcess:
    """One process bound to ``data_dir`` by the files ``<stem>.pid``, ``<stem>.log`` and ``<stem>-events.jsonl``.

    ``marker`` is an argument only our process has on its command line: a recycled pid is never mistaken for ours.
    """

    what = "process"
    error: type[DetachedProcessError] = DetachedProcessError

    def __init__(self, data_dir: Path, stem: str) -> None:
        self.data_dir = data_dir
        self.stem = stem
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_file(self) -> Path:
        return self.data_dir / f"{self.stem}.log"

    @property
    def events_file(self) -> Path:
        return self.data_dir / f"{self.stem}-events.jsonl"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / f"{self.stem}.pid"

    def marker(self) -> bytes:
        """What our process's command line contains (checked against ``/proc/<pid>/cmdline``)."""
        raise NotImplementedError

    def launch(self, args: Sequence[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
        """Start ``args`` detached and wait for its ready event (returned); raises on failure or timeout."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.events_file.touch()
        offset = self.events_file.stat().st_size
        with self.events_file.open("ab") as events, self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                list(args), stdin=subprocess.DEVNULL, stdout=events, stderr=log, start_new_session=True, env=env
            )
        self.pid_file.write_text(f"{self._process.pid}\n")
        return self._wait_for_event(offset, timeout)

    def stop(self, timeout: float = 90.0) -> bool:
        """Stop the process with SIGTERM (SIGKILL after ``timeout``). Returns False when nothing was running."""
        pid = self.running_pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self._alive(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                self._reap(pid, block=True)
                self.pid_file.unlink(missing_ok=True)
                raise self.error(f"{self.what} {pid} ignored SIGTERM for {timeout:.0f}s and was killed")
            time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        return True

    def running_pid(self) -> int | None:
        """The pid of our process on this data dir, or None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if not self._alive(pid):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if self.marker() in cmdline else None

    def log_tail(self, lines: int = _TAIL_LINES) -> str:
        """The last lines of the log, for error messages."""
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def _wait_for_event(self, offset: int, timeout: float) -> dict[str, Any]:
        assert self._process is not None
        deadline = time.monotonic() + timeout
        with self.events_file.open("rb") as events:
            events.seek(offset)
            buffered = b""
            while True:
                buffered += events.read()
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    event: dict[str, Any] = json.loads(line)
                    if event.get("event") == "ready":
                        return event
                    if event.get("event") == "failed":
                        self._process.wait(timeout=30)
                        raise self.error(f"{self.what} failed: {event.get('error')}\n{self.log_tail()}")
                if self._process.poll() is not None:
                    raise self.error(
                        f"{self.what} exited with {self._process.returncode} before it was ready\n{self.log_tail()}"
                    )
                if time.monotonic() > deadline:
                    self.stop()
                    raise self.error(f"{self.what} not ready within {timeout:.0f}s\n{self.log_tail()}")
                time.sleep(0.05)

    def _alive(self, pid: int) -> bool:
        if self._reap(pid, block=False):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie whose parent is someone else still answers kill(0); it has stopped all the same.
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
                return False
        return True

    def _reap(self, pid: int, *, block: bool) -> bool:
        """Collect our own child's exit status so it does not linger as a zombie. True when it has exited."""
        if self._process is None or self._process.pid != pid:
            return False
        if block:
            self._process.wait()
            return True
        return self._process.poll() is not None
