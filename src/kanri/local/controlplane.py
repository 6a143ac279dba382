"""Run the real control plane (etcd + kube-apiserver + kube-controller-manager + kube-scheduler) as a local process.

One :class:`ControlPlane` owns one data dir. The process is started detached (its own session) so ``kanri local up``
can return while it keeps running; ``exit_with_parent`` ties its life to the caller instead, which is what a test
session wants. Readiness comes from the binary's own ``{"event": "ready"}`` line, which it prints only after
``/readyz`` passes, the controllers have created the ``default`` ServiceAccount and the scheduler's informers have
synced.

Every start (re)writes the API server's admission configuration into the data dir: Pod Security ``baseline`` is
enforced on namespaces that set no level of their own, ``restricted`` is warned about and audited (issue 33: without
it a namespace admin could run a privileged pod with the data dir as a ``hostPath`` and read the admin kubeconfig).
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from kanri.local.build import BINARY_NAME, controlplane_binary
from kanri.local.detached import DetachedProcess, DetachedProcessError

#: The Pod Security levels of a namespace that sets none (its ``pod-security.kubernetes.io/<mode>`` labels win).
#: ``baseline`` refuses what reaches the node (privileged, host namespaces, ports and paths, added capabilities);
#: ``restricted`` is what every pod kanri makes meets, so asking for it in warnings costs kanri nothing and tells a
#: tenant where their pod falls short. Nothing is exempt: no pod in ``kube-system`` (or anywhere else) needs more,
#: and a namespace that does is labelled by a cluster admin (namespaces are cluster-scoped: a namespace ``admin``
#: cannot label its own).
POD_SECURITY_DEFAULTS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "enforce": "baseline",
        "enforce-version": "latest",
        "warn": "restricted",
        "warn-version": "latest",
        "audit": "restricted",
        "audit-version": "latest",
    }
)


def admission_configuration() -> dict[str, Any]:
    """The kube-apiserver's ``AdmissionConfiguration``: the PodSecurity plugin with :data:`POD_SECURITY_DEFAULTS`."""
    pod_security = {
        "apiVersion": "pod-security.admission.config.k8s.io/v1",
        "kind": "PodSecurityConfiguration",
        "defaults": dict(POD_SECURITY_DEFAULTS),
        "exemptions": {"usernames": [], "runtimeClasses": [], "namespaces": []},
    }
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [{"name": "PodSecurity", "configuration": pod_security}],
    }


class ControlPlaneError(DetachedProcessError):
    """The control plane failed to start or stop; the message includes the tail of its log."""


@dataclass(frozen=True)
class Endpoint:
    """How to reach a running control plane."""

    server: str
    kubeconfig: Path
    pid: int


SERVICE_CIDR_ENV = "KANRI_SERVICE_CIDR"
"""The Service range of a control plane's first start, when its caller names none (docs/local.md)."""


class ControlPlane(DetachedProcess):
    """The control-plane process bound to ``data_dir``."""

    what = "control plane"
    error = ControlPlaneError

    def __init__(self, data_dir: Path, binary: Path | None = None, service_cidr: str | None = None) -> None:
        """``service_cidr``: the Service range of a data dir's first start (else ``KANRI_SERVICE_CIDR``, else the
        binary's default, 10.96.0.0/16); a data dir keeps the range it started with, so later starts need not say it."""
        super().__init__(data_dir, "controlplane")
        self._binary = binary
        self._service_cidr = service_cidr or os.environ.get(SERVICE_CIDR_ENV) or None

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (user in ``system:masters``) the binary writes on every start."""
        return self.data_dir / "admin.kubeconfig"

    @property
    def admission_config(self) -> Path:
        """The admission configuration the API server reads (written by :meth:`start`)."""
        return self.data_dir / "admission.json"

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
        admission = self.write_admission_config()
        first = self.data_dir / "config.json"
        if self._service_cidr is not None and not first.exists():
            # the binary keeps what config.json says and fills in the rest (its ports) on this first start
            first.write_text(json.dumps({"serviceCIDR": self._service_cidr}) + "\n")
        args = [str(binary), f"--data-dir={self.data_dir}", f"--admission-control-config-file={admission}"]
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

    def write_admission_config(self) -> Path:
        """Write :func:`admission_configuration` to :attr:`admission_config` (replaced whole) and return its path.

        :meth:`start` calls it every time, so a data dir made by an older kanri gets today's defaults on its next
        start. The file is JSON, which the API server reads as the YAML it expects.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.admission_config.with_suffix(".tmp")
        tmp.write_text(json.dumps(admission_configuration(), indent=2) + "\n")
        tmp.replace(self.admission_config)
        return self.admission_config

    def _server_url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port()}"

    def _config(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self.data_dir / "config.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data
