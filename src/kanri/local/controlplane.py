"""Run the real control plane (etcd + kube-apiserver + kube-controller-manager + kube-scheduler) as a local process.

One :class:`ControlPlane` owns one data dir. The process is started detached (its own session) so ``kanri local up``
can return while it keeps running; ``exit_with_parent`` ties its life to the caller instead, which is what a test
session wants. Readiness comes from the binary's own ``{"event": "ready"}`` line, which it prints only after
``/readyz`` passes, the controllers have created the ``default`` ServiceAccount and the scheduler's informers have
synced.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kanri.local.build import BINARY_NAME, controlplane_binary
from kanri.local.detached import DetachedProcess, DetachedProcessError


class ControlPlaneError(DetachedProcessError):
    """The control plane failed to start or stop; the message includes the tail of its log."""


@dataclass(frozen=True)
class Endpoint:
    """How to reach a running control plane."""

    server: str
    kubeconfig: Path
    pid: int


class ControlPlane(DetachedProcess):
    """The control-plane process bound to ``data_dir``."""

    what = "control plane"
    error = ControlPlaneError

    def __init__(self, data_dir: Path, binary: Path | None = None) -> None:
        super().__init__(data_dir, "controlplane")
        self._binary = binary

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (user in ``system:masters``) the binary writes on every start."""
        return self.data_dir / "admin.kubeconfig"

    @property
    def events_file(self) -> Path:
        return self.data_dir / "events.jsonl"

    def marker(self) -> bytes:
        return f"--data-dir={self.data_dir}".encode()

    def running_pid(self) -> int | None:
        pid = super().running_pid()
        if pid is None:
            return None
        try:
            program = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            return None
        return pid if program.endswith(BINARY_NAME.encode()) else None

    def start(self, *, exit_with_parent: bool = False, timeout: float = 180.0) -> Endpoint:
        """Start the control plane unless it already runs, and return once it is ready.

        Idempotent: when a healthy process already owns the data dir, its endpoint is returned unchanged.
        """
        if (pid := self.running_pid()) is not None:
            return Endpoint(server=self._server_url(), kubeconfig=self.kubeconfig, pid=pid)
        binary = self._binary or controlplane_binary()
        args = [str(binary), f"--data-dir={self.data_dir}"]
        if exit_with_parent:
            args.append(f"--parent-pid={os.getpid()}")
        ready = self.launch(args, timeout)
        return Endpoint(server=str(ready["server"]), kubeconfig=Path(str(ready["kubeconfig"])), pid=int(ready["pid"]))

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

    def apiserver_port(self) -> int:
        config = self._config()
        if config is None:
            raise ControlPlaneError(f"{self.data_dir} has no config.json; the control plane never started there")
        return int(config["apiserverPort"])

    def _server_url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port()}"

    def _config(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self.data_dir / "config.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data
