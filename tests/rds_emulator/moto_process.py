"""moto's server as a child process on a free loopback port: the emulator's backend for RDS's shapes and errors.

A process, not moto's in-process thread, so that each emulator has its own state (moto's backends are module globals
shared by everything in one interpreter) and dies with its owner (PR_SET_PDEATHSIG on Linux).
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from kanri.local.ports import free_port

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Not Linux: no prctl, and the owner's stop() alone ends the process.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class MotoProcess:
    """``python -m moto.server`` on 127.0.0.1; ``url`` once started."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"moto's server exited with {self._process.returncode} before it answered")
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=2):
                    return
            except (urllib.error.URLError, OSError) as exc:
                last = exc
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"moto's server did not answer within {timeout} s: {last}")

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None
