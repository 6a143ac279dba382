"""NetworkPolicy enforcement on a real node: kube-network-policies (built by nodes/build.sh), one per node.

It runs as the node's own process, not as a pod: in the node's network namespace (where its pods' traffic is
forwarded, between the node's ``cni0`` ports through the bridge's netfilter hooks, and out through ``eth0``) and in
the node's cgroup (a stop of the node kills it with the rest). It installs the nftables table
``inet kube-network-policies`` there, which sends the first packet of every connection to or from a pod that a
NetworkPolicy selects to its nfqueue; it answers accept or drop from the policies it watches.

It finds the API only the in-cluster way (``KUBERNETES_SERVICE_HOST``, and a token and CA under
``/var/run/secrets/kubernetes.io/serviceaccount``). Without kube-proxy the ``kubernetes`` Service is no way in, so
the agent gets a mount namespace of its own (inside the node's), where ``/etc/hosts`` names ``kubernetes`` — a name on
the API server's certificate — at the host bridge's address (the nodes' way to the API server), and the
ServiceAccount directory is a bind mount of the agent's directory: a TokenRequest token of the
``kube-network-policies`` ServiceAccount (a file, never an argument) and the cluster CA.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from kanri.local.realnode import cgroups
from kanri.local.realnode.addons.kube import AddonError, apply, kubectl
from kanri.local.realnode.node import RealNode
from kanri.local.realnode.spec import NODE_NETWORK

NAME = "kube-network-policies"
NAMESPACE = "kube-system"
TABLE = "inet kube-network-policies"
TOKEN_LIFETIME = "48h"
_SERVICE_ACCOUNT_DIR = "/run/secrets/kubernetes.io/serviceaccount"  # /var/run is /run

#: Mounts the agent's view (hosts file, ServiceAccount directory), then becomes the agent: "$@" is its command.
_ENTER = (
    'mount --bind "$HOSTS_FILE" /etc/hosts && mkdir -p "$SA_DIR" && mount --bind "$TOKEN_DIR" "$SA_DIR" && exec "$@"'
)


def rbac() -> list[dict[str, object]]:
    """What the agent reads: pods, namespaces and nodes, and the NetworkPolicies."""
    rules = [
        {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
    ]
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"kanri:{NAME}"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"kanri:{NAME}"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"kanri:{NAME}"},
            "roleRef": role_ref,
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
    ]


class NetworkPolicyAgent:
    """kube-network-policies for ``node`` (which must be running): :meth:`start` returns once its nftables table is in
    the node's namespace; :meth:`stop` ends it and removes the table. A stop of the node ends it too."""

    def __init__(self, node: RealNode) -> None:
        self.node = node
        self.dir = node.layout.root / NAME
        self.log = node.layout.root / f"{NAME}.log"
        self._process: subprocess.Popen[bytes] | None = None

    def _node_pid(self) -> int:
        """A process of the node whose namespaces the agent joins (the kubelet's)."""
        kubelet = str(self.node.bin_dir / "kubelet")
        for pid in self.node.pids():
            try:
                if os.readlink(f"/proc/{pid}/exe") == kubelet:
                    return pid
            except OSError:
                continue
        raise AddonError(f"node {self.node.spec.name} runs no kubelet")

    def _prepare(self) -> dict[str, str]:
        """The agent's files (token, CA, hosts) and environment."""
        admin = self.node.admin_kubeconfig
        apply(admin, rbac())
        token = kubectl(admin, "-n", NAMESPACE, "create", "token", NAME, f"--duration={TOKEN_LIFETIME}").strip()
        tokens = self.dir / "serviceaccount"
        tokens.mkdir(parents=True, exist_ok=True)
        tokens.chmod(0o700)
        (tokens / "token").touch(mode=0o600)
        (tokens / "token").write_text(token)
        shutil.copyfile(self.node.control_plane_dir / "pki" / "ca.crt", tokens / "ca.crt")
        (tokens / "namespace").write_text(NAMESPACE)
        gateway = NODE_NETWORK.network_address + 1
        hosts = self.dir / "hosts"
        hosts.write_text(f"127.0.0.1 localhost\n{gateway} kubernetes\n")
        port = json.loads((self.node.control_plane_dir / "config.json").read_text())["apiserverPort"]
        return {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "KUBERNETES_SERVICE_HOST": "kubernetes",
            "KUBERNETES_SERVICE_PORT": str(port),
            "HOSTS_FILE": str(hosts),
            "TOKEN_DIR": str(tokens),
            "SA_DIR": _SERVICE_ACCOUNT_DIR,
        }

    def start(self, timeout: float = 30.0) -> None:
        self.stop()
        env = self._prepare()
        command = [
            "nsenter", "-t", str(self._node_pid()), "--mount", "--net",
            "unshare", "--mount", "--propagation", "private", "sh", "-c", _ENTER, "sh",
            str(self.node.bin_dir / NAME),
            f"--hostname-override={self.node.spec.name}",
            "--disable-nri",  # the pods' addresses come from the API (containerd's NRI socket is not set up)
            "--metrics-bind-address=127.0.0.1:9080",
            "--v=2",
        ]  # fmt: skip
        cgroup = self.node.spec.cgroup
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=lambda: cgroups.join(cgroup, os.getpid()),  # born in the node: its stop kills the agent
            )
        deadline = time.monotonic() + timeout
        while not self.table_exists():
            if self._process.poll() is not None:
                raise AddonError(f"{NAME} exited with {self._process.returncode}\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AddonError(f"{NAME} made no nftables table in {timeout} s\n{self.log_tail()}")
            time.sleep(0.2)

    def _nft(self, *args: str) -> subprocess.CompletedProcess[str]:
        netns = f"/run/netns/{self.node.spec.netns}"
        return subprocess.run(["nsenter", f"--net={netns}", "nft", *args], capture_output=True, text=True)

    def table_exists(self) -> bool:
        """Whether the agent's nftables table is in the node's network namespace."""
        return self._nft("list", "table", *TABLE.split()).returncode == 0

    def stop(self, timeout: float = 15.0) -> None:
        """End the agent (SIGTERM: it removes its table; SIGKILL after ``timeout``) and remove its table if left."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if (Path("/run/netns") / self.node.spec.netns).exists() and self.table_exists():
            self._nft("delete", "table", *TABLE.split())

    def log_tail(self, lines: int = 30) -> str:
        if not self.log.is_file():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
