"""NetworkPolicy enforcement on a real node: kube-network-policies (built by nodes/build.sh), one per node.

It runs as the node's own process, not as a pod: in the node's network namespace (where its pods' traffic passes,
between the node's ``cni0`` ports through the bridge's netfilter hooks, and out through ``eth0``) and in the node's
cgroup (a stop of the node kills it with the rest). The first packet of every new connection to or from one of the
node's pods goes to its nfqueue; it answers accept or drop from the NetworkPolicies, pods and namespaces it watches.

**The queue rule is ours.** Upstream the agent sends packets to its queue with an nftables ``queue`` statement, and
this machine's kernel is built without it (``# CONFIG_NFT_QUEUE is not set``: its table fails with "No such file or
directory"); it has the iptables ``NFQUEUE`` target (``CONFIG_NETFILTER_XT_TARGET_NFQUEUE=y``, through
``CONFIG_NFT_COMPAT``). So once the agent listens on its queue, the chain ``KANRI-NETPOL`` of the node's ``mangle``
``POSTROUTING`` (iptables-nft) does what the agent's own chain would: accept DNS (the agent's conntrack race
workaround), root's own traffic (kubelet probes) and established connections; queue the rest of the pod network's.
Upstream queues only the pods some policy selects (a set the agent keeps); this chain queues every pod of the node and
the agent accepts the unselected ones. ``--queue-bypass``: while no agent listens, packets pass (fail open), where
upstream drops the selected pods' packets. The agent's own attempts to write its table keep failing (logged).

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
QUEUE = 100
CHAIN = "KANRI-NETPOL"
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
    """kube-network-policies for ``node`` (which must be running): :meth:`start` returns once it listens on its queue
    and the queue chain is in place; :meth:`stop` removes the chain and ends it. A stop of the node ends both."""

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
            f"--nfqueue-id={QUEUE}",
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
        while not self.listening():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AddonError(f"{NAME} is not listening on nfqueue {QUEUE}\n{self.log_tail()}")
            time.sleep(0.2)
        self._install_queue_chain()

    def _in_node(self, *args: str, check: bool = True) -> str:
        """Run a command in the node's network namespace."""
        netns = f"--net=/run/netns/{self.node.spec.netns}"
        result = subprocess.run(["nsenter", netns, *args], capture_output=True, text=True)
        if check and result.returncode != 0:
            raise AddonError(f"{' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def listening(self) -> bool:
        """Whether a process listens on the agent's nfqueue in the node's namespace (/proc/net is per namespace)."""
        queues = self._in_node("cat", "/proc/net/netfilter/nfnetlink_queue", check=False)
        return any(line.split()[:1] == [str(QUEUE)] for line in queues.splitlines())

    def _install_queue_chain(self) -> None:
        pods = self.node.spec.pod_cidr
        rules = [
            ["-p", "udp", "--dport", "53", "-j", "RETURN"],
            ["-m", "owner", "--uid-owner", "0", "-j", "RETURN"],
            ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
            ["-s", pods, "-j", "NFQUEUE", "--queue-num", str(QUEUE), "--queue-bypass"],
            ["-d", pods, "-j", "NFQUEUE", "--queue-num", str(QUEUE), "--queue-bypass"],
        ]
        self._remove_queue_chain()
        self._in_node("iptables", "-t", "mangle", "-N", CHAIN)
        for rule in rules:
            self._in_node("iptables", "-t", "mangle", "-A", CHAIN, *rule)
        self._in_node("iptables", "-t", "mangle", "-A", "POSTROUTING", "-j", CHAIN)

    def _remove_queue_chain(self) -> None:
        iptables = ("iptables", "-t", "mangle")
        while self._jumps():
            self._in_node(*iptables, "-D", "POSTROUTING", "-j", CHAIN)
        if self.chain_installed():
            self._in_node(*iptables, "-F", CHAIN)
            self._in_node(*iptables, "-X", CHAIN)

    def _jumps(self) -> bool:
        rules = self._in_node("iptables", "-t", "mangle", "-S", "POSTROUTING", check=False)
        return f"-j {CHAIN}" in rules

    def chain_installed(self) -> bool:
        """Whether the queue chain is in the node's namespace."""
        return bool(self._in_node("iptables", "-t", "mangle", "-S", CHAIN, check=False))

    def stop(self) -> None:
        """Remove the queue chain, then kill the agent (its only state is its queue binding, which dies with it)."""
        if (Path("/run/netns") / self.node.spec.netns).exists():
            self._remove_queue_chain()
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def log_tail(self, lines: int = 30) -> str:
        if not self.log.is_file():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
