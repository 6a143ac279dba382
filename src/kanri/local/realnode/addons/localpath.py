"""Node-local volumes on real nodes: rancher's local-path-provisioner (built by nodes/build.sh) and its StorageClass.

The provisioner is a controller of the cluster, not of a node: it runs as one process on the machine (beside the
control plane, which it reaches at its loopback address) with a ServiceAccount's token (TokenRequest, in a file; no
secret on its command line). For each claim it creates a helper pod on the chosen node, from the tools image, that
makes the volume's directory under the node's path (a directory in the node's own directory: the machine's disk, as
a machine's local disk); the PersistentVolume is a ``hostPath`` bound to that node, mounted by its kubelet.

**Size is not enforced**: a local-path volume is a directory on the node's filesystem, and a claim of 1Gi can fill
the disk. Enforcing it would take a filesystem per volume (a loop-mounted image of the claimed size, made by the
``setup`` script and unmounted by ``teardown``; or XFS project quotas on an XFS node path); neither is done here.

The process outlives whoever started it (a session of its own, as ``kanri local up --real-nodes`` needs): it is
found again by name, as the process running this binary with this provisioner's kubeconfig, so any later process
can tell whether it runs and stop it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from kanri.local.realnode.addons.kube import AddonError, apply, kubectl

NAME = "local-path-provisioner"
NAMESPACE = "local-path-storage"
STORAGE_CLASS = "local-path"
PROVISIONER = "rancher.io/local-path"
CONFIG_MAP = "local-path-config"
TOKEN_LIFETIME = "48h"
#: Makes a StorageClass the one a claim without ``storageClassName`` gets (the DefaultStorageClass admission).
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
_STOP_GRACE = 10.0

#: The helper pod's scripts (the upstream ones): make the volume's directory, remove it.
SETUP = '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n'
TEARDOWN = '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n'


def _helper_pod(image: str) -> dict[str, Any]:
    """The helper pod template: the tools image (a shell and coreutils) as root, which owns the node path."""
    container = {
        "name": "helper-pod",
        "image": image,
        "imagePullPolicy": "Never",
        "securityContext": {"runAsUser": 0, "runAsGroup": 0},
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "helper-pod"}, "spec": {"containers": [container]}}


def _rbac() -> list[dict[str, Any]]:
    rules = [
        {"apiGroups": [""], "resources": ["nodes", "persistentvolumeclaims", "configmaps", "pods", "pods/log"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["persistentvolumes"],
         "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get", "list", "watch"]},
    ]  # fmt: skip
    helper_rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete", "get", "list", "watch"]}]
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    rbac = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": f"kanri:{NAME}"}, "rules": rules},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": f"kanri:{NAME}"},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": f"kanri:{NAME}"}, "subjects": subject},
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": {"name": NAME, "namespace": NAMESPACE},
         "rules": helper_rules},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": {"name": NAME, "namespace": NAMESPACE},
         "roleRef": {"apiGroup": rbac, "kind": "Role", "name": NAME}, "subjects": subject},
    ]  # fmt: skip


def manifests(node_paths: dict[str, str], helper_image: str, *, default_class: bool = False) -> list[dict[str, Any]]:
    """The namespace (privileged: helper pods mount host paths), RBAC, the ConfigMap and the StorageClass (the
    cluster's default one if ``default_class``)."""
    config = {"nodePathMap": [{"node": node, "paths": [path]} for node, path in sorted(node_paths.items())]}
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
    }
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
        "data": {
            "config.json": json.dumps(config),
            "setup": SETUP,
            "teardown": TEARDOWN,
            "helperPod.yaml": json.dumps(_helper_pod(helper_image)),
        },
    }
    storage_class = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: str(default_class).lower()}},
        "provisioner": PROVISIONER,
        "volumeBindingMode": "WaitForFirstConsumer",  # the volume is made on the node the pod is scheduled to
        "reclaimPolicy": "Delete",
    }
    return [namespace, *_rbac(), config_map, storage_class]


def _argv(pid: int) -> list[str]:
    """The command line of process ``pid`` (empty for a zombie or a process gone meanwhile)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone, or not ours to read
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


class LocalPathProvisioner:
    """The provisioner for the control plane of ``control_plane_dir``; its files and log live in ``work_dir``.

    ``node_paths`` maps each real node's name to the directory its volumes go in (created by the helper pods).
    ``default_class`` makes ``local-path`` the cluster's default StorageClass: claims that name no class get it.
    Only one cluster-wide default should exist, so it is off unless the cluster has no other (``kanri local up
    --real-nodes``); tests on a shared control plane name the class instead."""

    def __init__(
        self,
        control_plane_dir: Path,
        work_dir: Path,
        bin_dir: Path,
        node_paths: dict[str, str],
        helper_image: str,
        *,
        default_class: bool = False,
    ) -> None:
        self.control_plane_dir = control_plane_dir
        self.work_dir = work_dir
        self.binary = bin_dir / NAME
        self.node_paths = node_paths
        self.helper_image = helper_image
        self.default_class = default_class
        self.log = work_dir / f"{NAME}.log"
        self.kubeconfig = work_dir / "kubeconfig"
        self._token = work_dir / "token"
        self._process: subprocess.Popen[bytes] | None = None

    def _write_kubeconfig(self) -> None:
        """A kubeconfig naming a file with a TokenRequest token of the provisioner's ServiceAccount (both mode
        0600). The client re-reads the file, so writing a fresh token renews a running provisioner's access."""
        admin = self.control_plane_dir / "admin.kubeconfig"
        token = kubectl(admin, "-n", NAMESPACE, "create", "token", NAME, f"--duration={TOKEN_LIFETIME}").strip()
        port = json.loads((self.control_plane_dir / "config.json").read_text())["apiserverPort"]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": f"https://127.0.0.1:{port}",
                "certificate-authority": str(self.control_plane_dir / "pki" / "ca.crt")}}],
            "users": [{"name": NAME, "user": {"tokenFile": str(self._token)}}],
            "contexts": [{"name": NAME, "context": {"cluster": "local", "user": NAME}}],
            "current-context": NAME,
        }  # fmt: skip
        for path, text in ((self._token, token), (self.kubeconfig, json.dumps(config))):
            fresh = path.with_suffix(".new")
            fresh.unlink(missing_ok=True)
            fresh.touch(mode=0o600)
            fresh.write_text(text)
            fresh.replace(path)  # a reader sees the old file or the new one, never half of one

    def _apply(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        objects = manifests(self.node_paths, self.helper_image, default_class=self.default_class)
        apply(self.control_plane_dir / "admin.kubeconfig", objects)
        self._write_kubeconfig()

    def pids(self) -> set[int]:
        """The processes of this provisioner (its binary's name, its kubeconfig), whoever started them."""
        wanted = f"--kubeconfig={self.kubeconfig}"
        found = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                argv = _argv(int(entry.name))
                if argv and Path(argv[0]).name == NAME and wanted in argv:
                    found.add(int(entry.name))
        return found

    def start(self) -> None:
        """Apply the add-on's objects and start the provisioner (one already running is stopped first)."""
        self.stop()
        self._apply()
        command = [
            str(self.binary), "start",
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={NAMESPACE}",
            f"--configmap-name={CONFIG_MAP}",
            f"--service-account-name={NAME}",
            f"--helper-image={self.helper_image}",
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        time.sleep(0.5)  # a provisioner that cannot start (flags, kubeconfig) exits at once
        if self._process.poll() is not None:
            raise AddonError(f"{NAME} exited with {self._process.returncode}; see {self.log}")

    def ensure_running(self) -> bool:
        """Start the provisioner unless it runs; one that runs gets its objects applied again and a fresh token.
        Whether it was started."""
        if self.pids():
            self._apply()
            return False
        self.start()
        return True

    def stop(self) -> None:
        """SIGTERM every process of this provisioner, SIGKILL after a grace period; returns once none is left."""
        pids = self.pids()
        self._signal(pids, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE
        while pids and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.1)
            pids &= self.pids()
        self._signal(pids, signal.SIGKILL)
        deadline = time.monotonic() + _STOP_GRACE
        while self.pids() and time.monotonic() < deadline:  # one that outlives even this is in leftovers()
            self._reap()
            time.sleep(0.05)
        self._reap()

    def _reap(self) -> None:
        """Collect our own child's exit, if we started it (else the init process does, in its time)."""
        if self._process is not None and self._process.poll() is not None:
            self._process = None

    @staticmethod
    def _signal(pids: set[int], signum: signal.Signals) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.kill(pid, signum)

    def leftovers(self) -> list[str]:
        """Its processes still running (empty after :meth:`stop`)."""
        return [f"process {pid} ({NAME})" for pid in sorted(self.pids())]
