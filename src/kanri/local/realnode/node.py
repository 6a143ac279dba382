"""One real node: :meth:`RealNode.start` brings it up registered with a local control plane and waits until it is
Ready; :meth:`RealNode.stop` kills all of it at once and removes its namespace, links and cgroups.

The node's directory keeps what a machine's disk would (containerd's images, the kubelet's root dir, pod logs), so a
start after a stop finds its images and the same Node object comes back Ready.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kanri.local import paths
from kanri.local.realnode import cgroups, configs, network
from kanri.local.realnode.images import IMAGE_REGISTRY, BuiltImage, built_images
from kanri.local.realnode.launch import import_image
from kanri.local.realnode.pki import issue_node_certificates
from kanri.local.realnode.plan import LaunchPlan
from kanri.local.realnode.spec import NodeLayout, NodeSpec

PAUSE_IMAGE = "kanri-pause"
_LOG_TAIL = 30
_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes, the last one NUL

#: kubeadm's grant: the API server's kubelet client may use every kubelet API (logs, exec, port-forward). The
#: kubelet asks the API server (SubjectAccessReview) whether its caller may; without this binding it may not.
APISERVER_KUBELET_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "kanri:apiserver-kubelet-client"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kube-apiserver-kubelet-client"}],
}


def apiserver_endpoint_slice(address: str, port: int) -> dict[str, object]:
    """The ``kubernetes`` Service's endpoint as the nodes reach it: the host bridge address, which the host DNATs to
    the API server's loopback listener (its own reconciler is off: it would publish 127.0.0.1, which an
    EndpointSlice refuses and no node could reach). kube-proxy on each node sends the ClusterIP here."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes-realnodes",
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "kanri.local.realnode",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }


class RealNodeError(RuntimeError):
    """The node did not come up (the message carries the tail of the log that says why) or did not stop clean."""


def node_bin_dir() -> Path:
    """Where ``make node-components`` (nodes/build.sh) puts the node's binaries."""
    return paths.build_dir() / "node" / "bin"


@dataclass(frozen=True)
class NodeRegistry:
    """The machine's local registry (:class:`kanri.local.registry.LocalRegistry`: ``127.0.0.1:<port>``, its CA in
    ``ca_file``) that the node pulls ``kanri.local/<repository>:<tag>`` from when it does not hold the image —
    ``<prefix>/<repository>`` there, where ``kanri images push --local`` puts it."""

    port: int
    ca_file: Path
    prefix: str = "kanri"

    def saved(self) -> dict[str, object]:
        """As ``node.json`` keeps it."""
        return {"port": self.port, "caFile": str(self.ca_file), "prefix": self.prefix}

    @classmethod
    def loaded(cls, saved: dict[str, Any] | None) -> NodeRegistry | None:
        """From :meth:`saved` (None: the node pulls from no registry)."""
        return None if not saved else cls(int(saved["port"]), Path(saved["caFile"]), str(saved["prefix"]))


class RealNode:
    """One node named ``spec.name`` whose files live in ``data_dir``, for the control plane of ``control_plane_dir``.

    ``images`` are the built images (names in ``.build/images/images.json``) imported at start besides the pause
    image; pods name them ``kanri.local/<repository>:<tag>``. ``extra_layouts`` are more OCI layouts, each with the
    repository its tag is imported into. ``cluster_dns`` is the ClusterIP of the cluster's DNS Service (the
    kubelet's ``clusterDNS``), if there is one. ``registry``: where the node pulls the images it does not hold
    (none: import only, and a pod of a missing image fails ``ErrImageNeverPull`` or ``ErrImagePull``).
    """

    def __init__(
        self,
        spec: NodeSpec,
        data_dir: Path,
        control_plane_dir: Path,
        *,
        images: tuple[str, ...] = (),
        extra_layouts: tuple[tuple[Path, str], ...] = (),
        bin_dir: Path | None = None,
        images_dir: Path | None = None,
        cluster_dns: str | None = None,
        registry: NodeRegistry | None = None,
    ) -> None:
        self.spec = spec
        self.registry = registry
        self.layout = NodeLayout(data_dir)
        self.control_plane_dir = control_plane_dir
        self.bin_dir = bin_dir or node_bin_dir()
        self._images_dir = images_dir or paths.build_dir() / "images"
        self._image_names = (PAUSE_IMAGE, *images)
        self._extra_layouts = extra_layouts
        self.cluster_dns = cluster_dns
        self._process: subprocess.Popen[bytes] | None = None

    def save(self) -> None:
        """Write what this node is made of into its directory (``node.json``): a later process — the CLI's chaos
        verbs — acts on the node through :meth:`load`, as everything of a node is found by its name."""
        state = {
            "spec": {"name": self.spec.name, "zone": self.spec.zone, "index": self.spec.index},
            "controlPlaneDir": str(self.control_plane_dir),
            "images": list(self._image_names[1:]),
            "extraLayouts": [[str(layout), repository] for layout, repository in self._extra_layouts],
            "binDir": str(self.bin_dir),
            "imagesDir": str(self._images_dir),
            "clusterDNS": self.cluster_dns,
            "registry": None if self.registry is None else self.registry.saved(),
        }
        self.layout.state_file.write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def load(cls, data_dir: Path) -> RealNode:
        """The node whose directory is ``data_dir``, as its last :meth:`start` saved it."""
        state = json.loads(NodeLayout(data_dir).state_file.read_text())
        return cls(
            NodeSpec(**state["spec"]),
            data_dir,
            Path(state["controlPlaneDir"]),
            images=tuple(state["images"]),
            extra_layouts=tuple((Path(layout), repository) for layout, repository in state["extraLayouts"]),
            bin_dir=Path(state["binDir"]),
            images_dir=Path(state["imagesDir"]),
            cluster_dns=state["clusterDNS"],
            registry=NodeRegistry.loaded(state.get("registry")),
        )

    @property
    def admin_kubeconfig(self) -> Path:
        return self.control_plane_dir / "admin.kubeconfig"

    def image(self, name: str) -> BuiltImage:
        """The built image ``name`` as this node knows it."""
        return built_images(self._images_dir)[name]

    def start(self, timeout: float = 120.0) -> float:
        """Start the node (after removing whatever a crashed run left) and wait until it is Ready; the seconds
        that took."""
        started = time.monotonic()
        self.stop()
        missing = [b for b in ("kubelet", "containerd", "runc", "ctr") if not (self.bin_dir / b).is_file()]
        if missing:
            raise RealNodeError(f"{', '.join(missing)} missing in {self.bin_dir}: run `make node-components`")
        # the kubelet binds unix sockets under its root dir (pod-resources/<9 digits>): 107 bytes at most
        if len(str(self.layout.kubelet_root / "pod-resources" / "123456789")) > _MAX_SOCKET_PATH:
            raise RealNodeError(f"{self.layout.root} is too long a path for the kubelet's sockets; use a shorter one")
        self._prepare()
        self.save()
        previous = self._ready_heartbeat()
        command = [
            "nsenter", f"--net={network.NETNS_DIR / self.spec.netns}",
            "unshare", "--mount", "--propagation", "slave",
            sys.executable, "-m", "kanri.local.realnode.launch", str(self.layout.launch_plan),
        ]  # fmt: skip
        with self.layout.launch_log.open("ab") as launch_log:
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=launch_log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_ready(started + timeout, previous)
        except RealNodeError:
            self.stop()  # a node that did not come up leaves nothing running; its logs stay in its directory
            raise
        return time.monotonic() - started

    def _prepare(self) -> None:
        spec, layout = self.spec, self.layout
        config = json.loads((self.control_plane_dir / "config.json").read_text())
        port = int(config["apiserverPort"])
        images = built_images(self._images_dir)
        cgroups.create(spec.cgroup)
        with network.host_lock():
            network.ensure_host_network(port)
            network.add_node_network(spec)
            if self.registry is not None:
                network.forward_to_loopback(self.registry.port)
        control_plane_pki = self.control_plane_dir / "pki"
        issue_node_certificates(control_plane_pki, layout.pki, spec.name, spec.ip)
        for name in ("ca.crt", "proxy.crt", "proxy.key"):  # proxy.*: kube-proxy's identity, system:kube-proxy
            shutil.copyfile(control_plane_pki / name, layout.pki / name)
        configs.write_all(layout, spec, self.bin_dir, images[PAUSE_IMAGE].ref, port, self.cluster_dns)
        self._write_registry_hosts()
        for directory in (layout.containerd_root, layout.kubelet_root, layout.pod_logs):
            directory.mkdir(exist_ok=True)
        for manifest in (APISERVER_KUBELET_BINDING, apiserver_endpoint_slice(spec.gateway, port)):
            self._kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(manifest))
        plan = LaunchPlan(
            root=str(layout.root),
            cgroup=spec.cgroup,
            bin_dir=str(self.bin_dir),
            images=[(str(images[n].layout), images[n].base_name) for n in self._image_names]
            + [(str(layout_dir), repository) for layout_dir, repository in self._extra_layouts],
            kubelet_args=[
                f"--config={layout.kubelet_config}",
                f"--kubeconfig={layout.kubeconfig}",
                f"--root-dir={layout.kubelet_root}",
                f"--hostname-override={spec.name}",
                f"--node-ip={spec.ip}",
                f"--node-labels=topology.kubernetes.io/zone={spec.zone}",
                "--v=1",
            ],
            kube_proxy_args=configs.kube_proxy_args(layout, spec),
        )
        plan.save(layout.launch_plan)

    def _write_registry_hosts(self) -> None:
        """containerd's registry host for ``kanri.local`` (:func:`configs.registry_hosts`), or none."""
        hosts = self.layout.registry_hosts / IMAGE_REGISTRY
        shutil.rmtree(hosts, ignore_errors=True)
        if self.registry is None:
            return
        hosts.mkdir(parents=True)
        shutil.copyfile(self.registry.ca_file, self.layout.registry_ca)
        (hosts / "hosts.toml").write_text(configs.registry_hosts(self.layout, self.registry.port, self.registry.prefix))

    def _kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            ["kubectl", f"--kubeconfig={self.admin_kubeconfig}", *args], input=stdin, capture_output=True, text=True
        )
        if result.returncode != 0:
            raise RealNodeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def _ready_heartbeat(self) -> datetime.datetime | None:
        """When a kubelet last reported the Node Ready (None: no such Node, or not Ready)."""
        try:
            node = json.loads(self._kubectl("get", "node", self.spec.name, "-o", "json"))
        except RealNodeError:
            return None
        for condition in node.get("status", {}).get("conditions", []):
            if condition["type"] == "Ready" and condition["status"] == "True":
                return datetime.datetime.fromisoformat(condition["lastHeartbeatTime"])
        return None

    def is_ready(self) -> bool:
        """Whether the Node object's Ready condition is True (as the control plane sees it: a node stopped less
        than the node controller's grace period ago still counts)."""
        return self._ready_heartbeat() is not None

    def _wait_ready(self, deadline: float, previous: datetime.datetime | None) -> None:
        """Wait for a Ready report of the kubelet just launched: newer than ``previous`` (the last report before the
        launch, by a kubelet now dead) and not older than the launch (the API's times have whole seconds)."""
        launched = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        while True:
            heartbeat = self._ready_heartbeat()
            if heartbeat is not None and heartbeat >= launched and (previous is None or heartbeat > previous):
                return
            if self._process is not None and self._process.poll() is not None:
                raise RealNodeError(f"node {self.spec.name} exited with {self._process.returncode}\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RealNodeError(f"node {self.spec.name} not Ready in time\n{self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self) -> str:
        """The last lines of the launcher's, containerd's and the kubelet's logs."""
        parts = []
        for log in (self.layout.launch_log, self.layout.containerd_log, self.layout.kubelet_log):
            if log.is_file():
                lines = log.read_text(errors="replace").splitlines()[-_LOG_TAIL:]
                parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def import_images(self, names: Iterable[str]) -> None:
        """Import more built images into the running node's containerd, as a registry pull would bring them
        (cheap for what it holds already; kept on the node's disk across restarts)."""
        containerd = next((pid for pid in self.pids() if _comm(pid) == "containerd"), None)
        if containerd is None:
            raise RealNodeError(f"{self.spec.name} runs no containerd: start it first")
        images = built_images(self._images_dir)
        env = {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
        enter = ("nsenter", "-t", str(containerd), "-m")
        for name in names:
            try:
                import_image(self.bin_dir, images[name].layout, images[name].base_name, env, enter)
            except SystemExit as exc:  # the launcher's way of failing
                raise RealNodeError(str(exc)) from None

    def pids(self) -> set[int]:
        """Every process of the node (kubelet, containerd, shims, containers)."""
        return cgroups.members(self.spec.cgroup)

    def stop(self) -> None:
        """Kill every process of the node at once (SIGKILL, like a power loss), then remove its cgroups,
        namespace and links; the bridge goes with the last node. The node's directory stays."""
        cgroups.kill_all(self.spec.cgroup)
        if self._process is not None:
            self._process.wait()
            self._process = None
        cgroups.remove(self.spec.cgroup)
        with network.host_lock():
            network.remove_node_network(self.spec)
            network.remove_host_network_if_unused()

    def deregister(self) -> None:
        """Delete the Node object (after :meth:`stop`: a running kubelet would register it again), so that nothing
        is scheduled onto a node that is gone for good."""
        self._kubectl("delete", "node", self.spec.name, "--ignore-not-found", "--wait=false")

    def freeze(self) -> None:
        """Freeze every process of the node — kubelet, containerd, shims, containers — at once; :meth:`thaw` resumes
        them. A frozen kubelet stops heartbeating: the node controller's NotReady and taints follow."""
        cgroups.set_frozen(self.spec.cgroup, True)

    def thaw(self) -> None:
        cgroups.set_frozen(self.spec.cgroup, False)

    def is_frozen(self) -> bool:
        return cgroups.is_frozen(self.spec.cgroup)

    def is_partitioned(self) -> bool:
        return network.is_partitioned(self.spec)

    def partition(self) -> None:
        """Cut the node's network off the other nodes and the control plane (nftables in its namespace); its
        processes run on, as on a machine whose switch port died. :meth:`heal` reconnects it."""
        network.partition(self.spec)

    def heal(self) -> None:
        network.heal(self.spec)

    def leftovers(self) -> list[str]:
        """What of the node still exists on the machine (empty after :meth:`stop`)."""
        mounts = [
            f"mount {line.split()[4]}"
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if str(self.layout.root) in line.split()[4]
        ]
        return network.leftovers(self.spec) + cgroups.leftovers(self.spec.cgroup) + mounts


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # ended meanwhile
        return ""
