"""The node's configuration files: containerd's ``config.toml``, the ``KubeletConfiguration``, the kubelet's
kubeconfig and the CNI network list. Pure functions of the node and where things are, written at each start.

The choices that matter here, and why:

- cgroup v1 (this machine's hierarchy): containerd 2.x still supports it; the kubelet refuses it from 1.35 on unless
  ``failCgroupV1: false``. No systemd runs, so both use the ``cgroupfs`` driver, and ``cgroupRoot`` is the node's
  own cgroup so that every pod of the node lives under it (a stop kills the subtree).
- The kubelet API authenticates clients by the cluster CA or a TokenReview and authorizes them by a
  SubjectAccessReview (``Webhook``), as a kubeadm node does; anonymous requests are refused.
- ``protectKernelDefaults: true``: the kubelet would otherwise rewrite machine-wide sysctls (``kernel.panic``,
  ``vm.overcommit_memory``); inside the node it reads files that already hold the values it wants (launch.py).
- No process on this machine may lower an ``oom_score_adj`` (CAP_SYS_RESOURCE is outside every bounding set), so
  containerd clamps the pods' scores at its own (``restrict_oom_score_adj``, made for rootless containerd) and the
  kubelet keeps 0 for itself: pods the kubelet would protect from the OOM killer (the pause process at -998,
  Guaranteed pods at -997) are not protected more than containerd here.
- Eviction thresholds are low: the node shares the machine's disk with everything else, and a kubelet that evicts
  pods because another program filled the disk would test nothing of kanri's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kanri.local.realnode.spec import (
    CNI_LEASES,
    CONTAINERD_SOCKET,
    CONTAINERD_STATE,
    GATEWAY,
    POD_SUPERNET,
    NodeLayout,
    NodeSpec,
)

#: The values the kubelet insists on (pkg/kubelet/cm: setupKernelTunables), shown to it inside the node.
KERNEL_TUNABLES = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


def _toml_tables(tables: dict[str, dict[str, object]]) -> str:
    lines = ["version = 3"]
    for name, keys in tables.items():
        if name:
            lines.append(f"\n[{name}]")
        lines.extend(f"{key} = {_toml(value)}" for key, value in keys.items())
    return "\n".join(lines) + "\n"


def containerd_config(layout: NodeLayout, bin_dir: Path, pause_image: str) -> str:
    """containerd's config.toml (version 3): CRI with the runc shim, overlayfs, the node's CNI and pause image."""
    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    runc = f"{cri_runtime}.containerd.runtimes.runc"
    tables: dict[str, dict[str, object]] = {
        "": {"root": str(layout.containerd_root), "state": str(CONTAINERD_STATE)},
        "grpc": {"address": str(CONTAINERD_SOCKET)},
        "ttrpc": {"address": f"{CONTAINERD_SOCKET}.ttrpc"},
        "plugins.'io.containerd.cri.v1.images'": {"snapshotter": "overlayfs"},
        "plugins.'io.containerd.cri.v1.images'.pinned_images": {"sandbox": pause_image},
        # per registry host a hosts.toml (registry_hosts below); none there: images come by import only
        "plugins.'io.containerd.cri.v1.images'.registry": {"config_path": str(layout.registry_hosts)},
        cri_runtime: {
            "netns_mounts_under_state_dir": True,
            "enable_selinux": False,
            # no oom_score_adj below containerd's own (0): this machine withholds CAP_SYS_RESOURCE from everyone
            "restrict_oom_score_adj": True,
        },
        f"{cri_runtime}.containerd": {"default_runtime_name": "runc"},
        runc: {"runtime_type": "io.containerd.runc.v2"},
        f"{runc}.options": {"BinaryName": str(bin_dir / "runc"), "SystemdCgroup": False},
        f"{cri_runtime}.cni": {"bin_dirs": [str(bin_dir / "cni")], "conf_dir": str(layout.cni_conf)},
        "plugins.'io.containerd.grpc.v1.cri'": {"stream_server_address": "127.0.0.1", "stream_server_port": "0"},
    }
    return _toml_tables(tables)


def kubelet_config(
    layout: NodeLayout, spec: NodeSpec, resolv_conf: Path, cluster_dns: str | None = None
) -> dict[str, Any]:
    """The ``KubeletConfiguration`` (written as JSON, which the kubelet reads as YAML); ``cluster_dns``: the
    ClusterIP of the cluster's DNS Service, for pods of ``dnsPolicy: ClusterFirst``."""
    pki = layout.pki
    dns: dict[str, Any] = {"clusterDNS": [cluster_dns]} if cluster_dns else {}
    return {
        **dns,
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{spec.cgroup}",
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "address": spec.ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(pki / "serving.crt"),
        "tlsPrivateKeyFile": str(pki / "serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "podLogsDir": str(layout.pod_logs),
        "resolvConf": str(resolv_conf),
        "clusterDomain": "cluster.local",
        "protectKernelDefaults": True,
        "failSwapOn": False,
        "oomScoreAdj": 0,  # the kubelet's own; it may not go lower here (no CAP_SYS_RESOURCE, see containerd_config)
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "10s",
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 99,
        "imageGCLowThresholdPercent": 98,
    }


def kubeconfig(layout: NodeLayout, spec: NodeSpec, apiserver_port: int, user: str, cert_stem: str) -> dict[str, Any]:
    """A kubeconfig of the node's (the kubelet's, kube-proxy's): the API server at the host bridge address (DNAT to
    its loopback listener), as ``user`` with the certificate ``pki/<cert_stem>.crt``.

    The API server's certificate names ``localhost`` and 127.0.0.1, not the bridge address, so the client checks
    it for ``localhost`` (``tls-server-name``)."""
    pki = layout.pki
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": f"https://{spec.gateway}:{apiserver_port}",
                    "certificate-authority": str(pki / "ca.crt"),
                    "tls-server-name": "localhost",
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{cert_stem}.crt"),
                    "client-key": str(pki / f"{cert_stem}.key"),
                },
            }
        ],
        "contexts": [{"name": "node", "context": {"cluster": "local", "user": user}}],
        "current-context": "node",
    }


def kube_proxy_args(layout: NodeLayout, spec: NodeSpec) -> list[str]:
    """kube-proxy's command line: nftables mode in the node's namespace (its tables are the node's, not the
    machine's), the node's name and address, every pod network as the cluster's; it changes no conntrack sysctl
    (several are machine-wide) and serves health and metrics on the node's loopback only."""
    return [
        "--proxy-mode=nftables",
        f"--kubeconfig={layout.kube_proxy_kubeconfig}",
        f"--hostname-override={spec.name}",
        f"--bind-address={spec.ip}",
        f"--cluster-cidr={POD_SUPERNET}",
        "--detect-local-mode=ClusterCIDR",
        "--healthz-bind-address=127.0.0.1:10256",
        "--metrics-bind-address=127.0.0.1:10249",
        "--conntrack-max-per-core=0",
        "--conntrack-min=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--oom-score-adj=0",
        "--v=1",
    ]


def cni_network(spec: NodeSpec) -> dict[str, Any]:
    """The node's pod network: the CNI bridge plugin (``cni0``, the pods' gateway) with host-local addresses.

    Leases live under /run (the node's tmpfs): after a stop no pod holds an address, and none is leaked."""
    return {
        "cniVersion": "1.0.0",
        "name": "kanri-realnode",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": spec.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(CNI_LEASES),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "backend": "nftables"},
        ],
    }


def registry_hosts(layout: NodeLayout, port: int, prefix: str) -> str:
    """containerd's ``hosts.toml`` for the registry host ``kanri.local`` (``images.IMAGE_REGISTRY``): pull
    ``kanri.local/<repository>:<tag>`` from the machine's local registry at the gateway's ``port``, under its
    ``prefix`` (what ``kanri images push --local`` pushes to: ``<prefix>/<repository>``), trusting its CA. The
    ``override_path`` makes the URL's path the registry API's root, so the names pods use are the ones imported
    images have, whichever way an image arrived."""
    server = f"https://{GATEWAY}:{port}/v2/{prefix}"
    keys = {"server": server, "capabilities": ["pull", "resolve"], "ca": str(layout.registry_ca),
            "override_path": True}  # fmt: skip
    return "\n".join(f"{key} = {_toml(value)}" for key, value in keys.items()) + "\n"


def write_all(
    layout: NodeLayout,
    spec: NodeSpec,
    bin_dir: Path,
    pause_image: str,
    apiserver_port: int,
    cluster_dns: str | None = None,
) -> None:
    """Write every configuration file of the node into its directory."""
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.containerd_config.write_text(containerd_config(layout, bin_dir, pause_image))
    resolv = layout.root / "resolv.conf"
    resolv.write_text(Path("/etc/resolv.conf").read_text())
    layout.kubelet_config.write_text(json.dumps(kubelet_config(layout, spec, resolv, cluster_dns), indent=2) + "\n")
    for path, user, stem in (
        (layout.kubeconfig, f"system:node:{spec.name}", "client"),
        (layout.kube_proxy_kubeconfig, "system:kube-proxy", "proxy"),
    ):
        path.write_text(json.dumps(kubeconfig(layout, spec, apiserver_port, user, stem), indent=2) + "\n")
        path.chmod(0o600)
    layout.cni_conf.mkdir(exist_ok=True)
    (layout.cni_conf / "10-kanri.conflist").write_text(json.dumps(cni_network(spec), indent=2) + "\n")
    layout.sysctl_dir.mkdir(exist_ok=True)
    for name, value in KERNEL_TUNABLES.items():
        (layout.sysctl_dir / name.replace("/", ".")).write_text(f"{value}\n")
