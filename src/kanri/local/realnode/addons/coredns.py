"""Cluster DNS on real nodes: CoreDNS (built from its Go module by nodes/build.sh) in an image of its own, run as the
Deployment ``kube-system/coredns`` behind the Service ``kube-system/kube-dns``.

Why it looks the way it does:

- **A pod like any other**: on the pod network, reading the API the in-cluster way (the ``kubernetes`` Service,
  which each node's kube-proxy sends to the API server; its certificate names the Service's address).
- **Port 53 as a non-root user**: the pod sets the namespaced sysctl ``net.ipv4.ip_unprivileged_port_start=53``
  (one of the kubelet's safe sysctls; Pod Security ``baseline`` and ``restricted`` allow it), so the image needs no
  capability (file capabilities would need xattrs in the layer).
- **The ClusterIP** is the tenth address of the control plane's Service range (``serviceCIDR`` in its config.json),
  as kubeadm chooses it; the kubelets' ``clusterDNS`` must name the same address.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kanri.local.realnode.addons.image import BinaryImage, write_binary_image
from kanri.local.realnode.addons.kube import apply
from kanri.local.realnode.images import IMAGE_REGISTRY

NAMESPACE = "kube-system"
NAME = "coredns"
SERVICE = "kube-dns"
REPOSITORY = f"{IMAGE_REGISTRY}/kanri-coredns"
DNS_PORT = 53
READY_PORT = 8181
CLUSTER_DOMAIN = "cluster.local"
_CONFIG_DIR = "/etc/coredns"


def cluster_dns_ip(service_cidr: str) -> str:
    """The kube-dns Service's ClusterIP: the tenth address of the Service range (kubeadm's choice)."""
    return str(ipaddress.IPv4Network(service_cidr).network_address + 10)


def coredns_image(bin_dir: Path, target: Path) -> tuple[Path, str]:
    """Write the CoreDNS image (the binary ``nodes/build.sh`` built, tagged with its pinned version) at ``target``;
    the layout and repository to give :class:`~kanri.local.realnode.RealNode` as an extra layout."""
    version = (bin_dir / "coredns.version").read_text().strip()
    write_binary_image(BinaryImage(bin_dir / "coredns", version.removeprefix("v")), target)
    return target, REPOSITORY


def image_ref(bin_dir: Path) -> str:
    return f"{REPOSITORY}:{(bin_dir / 'coredns.version').read_text().strip().removeprefix('v')}"


def corefile() -> str:
    """Kubernetes names from the API, everything else forwarded to the node's resolvers."""
    return f""".:{DNS_PORT} {{
    errors
    ready :{READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    forward . /etc/resolv.conf
    cache 30
}}
"""


def _rbac() -> list[dict[str, Any]]:
    """What CoreDNS's kubernetes plugin watches (the rules of the upstream ``system:coredns`` role)."""
    rules = [
        {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ]
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
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"kanri:{NAME}"},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
    ]


def _pod_template(image: str, node_selector: dict[str, str]) -> dict[str, Any]:
    container = {
        "name": NAME,
        "image": image,
        "imagePullPolicy": "Never",
        "args": ["-conf", f"{_CONFIG_DIR}/Corefile"],
        "ports": [{"name": "dns", "containerPort": DNS_PORT, "protocol": "UDP"}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": READY_PORT}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "config", "mountPath": _CONFIG_DIR, "readOnly": True}],
    }
    return {
        "metadata": {"labels": {"k8s-app": SERVICE}},
        "spec": {
            "serviceAccountName": NAME,
            "dnsPolicy": "Default",  # CoreDNS forwards to the node's resolvers, never to itself
            "securityContext": {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": str(DNS_PORT)}]},
            "nodeSelector": node_selector,
            "priorityClassName": "system-cluster-critical",
            "containers": [container],
            "volumes": [{"name": "config", "configMap": {"name": NAME}}],
        },
    }


def manifests(cluster_ip: str, image: str, node_selector: dict[str, str]) -> list[dict[str, Any]]:
    """Every object of the add-on: RBAC, the ConfigMap (Corefile), the Deployment, the Service."""
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "data": {"Corefile": corefile()},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"k8s-app": SERVICE}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"k8s-app": SERVICE}},
            "template": _pod_template(image, node_selector),
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": {"k8s-app": SERVICE}},
        "spec": {
            "clusterIP": cluster_ip,
            "selector": {"k8s-app": SERVICE},
            "ports": [
                {"name": "dns", "port": 53, "targetPort": DNS_PORT, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "targetPort": DNS_PORT, "protocol": "TCP"},
            ],
        },
    }
    return [*_rbac(), config_map, deployment, service]


@dataclass(frozen=True)
class ClusterDNS:
    """Where the cluster's DNS answers: the Service's ClusterIP (port 53) and the server's own port on its pod."""

    cluster_ip: str
    pod_port: int = DNS_PORT


def install_coredns(control_plane_dir: Path, bin_dir: Path, node_selector: dict[str, str] | None = None) -> ClusterDNS:
    """Apply CoreDNS to the control plane of ``control_plane_dir`` (server-side, so a second install changes
    nothing); its nodes must have imported the image (:func:`coredns_image`). Returns where it answers."""
    config = json.loads((control_plane_dir / "config.json").read_text())
    cluster_ip = cluster_dns_ip(str(config["serviceCIDR"]))
    objects = manifests(cluster_ip, image_ref(bin_dir), node_selector or {})
    apply(control_plane_dir / "admin.kubeconfig", objects)
    return ClusterDNS(cluster_ip)
