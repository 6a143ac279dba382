"""Run the real control plane (etcd + kube-apiserver + kube-controller-manager) as a local process.

One :class:`ControlPlane` owns one data dir. The process is started detached (its own session) so ``kanri local up``
can return while it keeps running; ``exit_with_parent`` ties its life to the caller instead, which is what a test
session wants. Readiness comes from the binary's own ``{"event": "ready"}`` line, which it prints only after
``/readyz`` passes and the controllers have created the ``default`` ServiceAccount.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kanri.local.build import BINARY_NAME, controlplane_binary

_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """The control plane failed to start or stop; the message includes the tail of its log."""


@dataclass(frozen=True)
class Endpoint:
    """How to reach a running control plane."""

    server: str
    kubeconfig: Path
    pid: int


class ControlPlane:
    """The control-plane process bound to ``data_dir``."""

    def __init__(self, data_dir: Path, binary: Path | None = None) -> None:
        self.data_dir = data_dir
        self._binary = binary
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (user in ``system:masters``) the binary writes on every start."""
        return self.data_dir / "admin.kubeconfig"

    @property
    def log_file(self) -> Path:
        """The components' own log (stderr of the process)."""
        return self.data_dir / "controlplane.log"

    @property
    def _events_file(self) -> Path:
        return self.data_dir / "events.jsonl"

    @property
    def _pid_file(self) -> Path:
        return self.data_dir / "controlplane.pid"

    def start(self, *, exit_with_parent: bool = False, timeout: float = 180.0) -> Endpoint:
        """Start the control plane unless it already runs, and return once it is ready.

        Idempotent: when a healthy process already owns the data dir, its endpoint is returned unchanged.
        """
        if (pid := self.running_pid()) is not None:
            return Endpoint(server=self._server_url(), kubeconfig=self.kubeconfig, pid=pid)
        binary = self._binary or controlplane_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._events_file.touch()
        offset = self._events_file.stat().st_size
        args = [str(binary), f"--data-dir={self.data_dir}"]
        if exit_with_parent:
            args.append(f"--parent-pid={os.getpid()}")
        with self._events_file.open("ab") as events, self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=events, stderr=log, start_new_session=True
            )
        self._pid_file.write_text(f"{self._process.pid}\n")
        ready = self._wait_for_event(offset, timeout)
        return Endpoint(server=str(ready["server"]), kubeconfig=Path(str(ready["kubeconfig"])), pid=int(ready["pid"]))

    def stop(self, timeout: float = 90.0) -> bool:
        """Stop the process with SIGTERM (SIGKILL after ``timeout``). Returns False when nothing was running."""
        pid = self.running_pid()
        if pid is None:
            self._pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self._alive(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                self._reap(pid, block=True)
                self._pid_file.unlink(missing_ok=True)
                raise ControlPlaneError(f"control plane {pid} ignored SIGTERM for {timeout:.0f}s and was killed")
            time.sleep(0.1)
        self._pid_file.unlink(missing_ok=True)
        return True

    def running_pid(self) -> int | None:
        """The pid of the control plane owning this data dir, or None."""
        try:
            pid = int(self._pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if not self._alive(pid):
            return None
        # A recycled pid belongs to some other program: only trust it when it is our binary on our data dir.
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if not cmdline or not cmdline[0].endswith(BINARY_NAME.encode()):
            return None
        if f"--data-dir={self.data_dir}".encode() not in cmdline:
            return None
        return pid

    def is_ready(self, timeout: float = 5.0) -> bool:
        """Whether the API server answers ``/readyz`` with ``ok`` right now."""
        config = self._config()
        if config is None:
            return False
        pki = self.data_dir / "pki"
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        conn = http.client.HTTPSConnection("127.0.0.1", int(config["apiserverPort"]), context=context, timeout=timeout)
        try:
            conn.request("GET", "/readyz")
            response = conn.getresponse()
            return response.status == 200 and response.read() == b"ok"
        except OSError:
            return False
        finally:
            conn.close()

    def log_tail(self, lines: int = _TAIL_LINES) -> str:
        """The last lines of the components' log, for error messages."""
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def _server_url(self) -> str:
        config = self._config()
        if config is None:
            raise ControlPlaneError(f"{self.data_dir} has no config.json; the control plane never started there")
        return f"https://127.0.0.1:{config['apiserverPort']}"

    def _config(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self.data_dir / "config.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data

    def _wait_for_event(self, offset: int, timeout: float) -> dict[str, Any]:
        assert self._process is not None
        deadline = time.monotonic() + timeout
        with self._events_file.open("rb") as events:
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
                        raise ControlPlaneError(f"control plane failed: {event.get('error')}\n{self.log_tail()}")
                if self._process.poll() is not None:
                    raise ControlPlaneError(
                        f"control plane exited with {self._process.returncode} before it was ready\n{self.log_tail()}"
                    )
                if time.monotonic() > deadline:
                    self.stop()
                    raise ControlPlaneError(f"control plane not ready within {timeout:.0f}s\n{self.log_tail()}")
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
