"""Node-local volumes on real nodes: rancher's local-path-provisioner (built by nodes/build.sh) and its StorageClass.

The provisioner is a controller of the cluster, not of a node: it runs as one process on the machine (beside the
control plane, which it reaches at its loopback address) with a ServiceAccount's token (TokenRequest, in a file; no
secret on its command line). For each claim it creates a helper pod on the chosen node, from the tools image, that
makes the volume's directory under the node's path (a directory in the node's own directory: the machine's disk, as
a machine's local disk); the PersistentVolume is a ``hostPath`` bound to that node, mounted by its kubelet.

**Size is not enforced**: a local-path volume is a directory on the node's filesystem, and a claim of 1Gi can fill
the disk. Enforcing it would take a filesystem per volume (a loop-mounted image of the claimed size, made by the
``setup`` script and unmounted by ``teardown``; or XFS project quotas on an XFS node path); neither is done here.
"""

from __future__ import annotations

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


def manifests(node_paths: dict[str, str], helper_image: str) -> list[dict[str, Any]]:
    """The namespace (privileged: helper pods mount host paths), RBAC, the ConfigMap and the StorageClass."""
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
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": PROVISIONER,
        "volumeBindingMode": "WaitForFirstConsumer",  # the volume is made on the node the pod is scheduled to
        "reclaimPolicy": "Delete",
    }
    return [namespace, *_rbac(), config_map, storage_class]


class LocalPathProvisioner:
    """The provisioner for the control plane of ``control_plane_dir``; its files and log live in ``work_dir``.

    ``node_paths`` maps each real node's name to the directory its volumes go in (created by the helper pods)."""

    def __init__(
        self, control_plane_dir: Path, work_dir: Path, bin_dir: Path, node_paths: dict[str, str], helper_image: str
    ) -> None:
        self.control_plane_dir = control_plane_dir
        self.work_dir = work_dir
        self.binary = bin_dir / NAME
        self.node_paths = node_paths
        self.helper_image = helper_image
        self.log = work_dir / f"{NAME}.log"
        self._process: subprocess.Popen[bytes] | None = None

    def _kubeconfig(self) -> Path:
        """A kubeconfig with a TokenRequest token of the provisioner's ServiceAccount (mode 0600)."""
        admin = self.control_plane_dir / "admin.kubeconfig"
        token = kubectl(admin, "-n", NAMESPACE, "create", "token", NAME, f"--duration={TOKEN_LIFETIME}").strip()
        port = json.loads((self.control_plane_dir / "config.json").read_text())["apiserverPort"]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": f"https://127.0.0.1:{port}",
                "certificate-authority": str(self.control_plane_dir / "pki" / "ca.crt")}}],
            "users": [{"name": NAME, "user": {"token": token}}],
            "contexts": [{"name": NAME, "context": {"cluster": "local", "user": NAME}}],
            "current-context": NAME,
        }  # fmt: skip
        path = self.work_dir / "kubeconfig"
        path.touch(mode=0o600)
        path.write_text(json.dumps(config))
        return path

    def start(self) -> None:
        """Apply the add-on's objects and start the provisioner."""
        self.stop()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        apply(self.control_plane_dir / "admin.kubeconfig", manifests(self.node_paths, self.helper_image))
        command = [
            str(self.binary), "start",
            f"--kubeconfig={self._kubeconfig()}",
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

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
