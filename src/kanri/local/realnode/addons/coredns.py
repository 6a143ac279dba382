"""Cluster DNS on real nodes: CoreDNS (built from its Go module by nodes/build.sh) in an image of its own, run as the
Deployment ``kube-system/coredns`` behind the Service ``kube-system/kube-dns``.

Why it looks the way it does:

- **Host network.** Written when a real node's pods could not reach the API server, CoreDNS runs in a node's network
  namespace, where the kubelet reaches it: at the host bridge's address, with the certificate checked for
  ``localhost``. It reads the API with a kubeconfig (a ConfigMap: no secret in it) naming the pod's projected
  ServiceAccount token and CA. Now that pods route to the API server, a pod-network CoreDNS with the in-cluster
  config would do without the privileged namespace below (docs/real-nodes.md, "Not done yet").
- **Port 1053.** The image runs as a non-root user, which may not bind a port below 1024 (file capabilities would need
  xattrs in the layer). Clients reach it at the pod's address on 1053; the Service maps port 53 to it, so a kube-proxy
  makes ``<clusterIP>:53`` work for every pod's ``/etc/resolv.conf``.
- **kube-system is privileged** (its Pod Security label): the control plane enforces ``baseline`` everywhere else,
  which refuses a host-network pod.
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
from kanri.local.realnode.spec import NODE_NETWORK

NAMESPACE = "kube-system"
NAME = "coredns"
SERVICE = "kube-dns"
REPOSITORY = f"{IMAGE_REGISTRY}/kanri-coredns"
DNS_PORT = 1053
READY_PORT = 8181
CLUSTER_DOMAIN = "cluster.local"
_SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
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
        kubeconfig {_CONFIG_DIR}/kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    forward . /etc/resolv.conf
    cache 30
}}
"""


def api_kubeconfig(apiserver: str) -> dict[str, Any]:
    """CoreDNS's kubeconfig: the API server as the node reaches it, the pod's own token and CA (files, re-read)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": apiserver,
                    "certificate-authority": f"{_SERVICE_ACCOUNT_DIR}/ca.crt",
                    "tls-server-name": "localhost",
                },
            }
        ],
        "users": [{"name": NAME, "user": {"tokenFile": f"{_SERVICE_ACCOUNT_DIR}/token"}}],
        "contexts": [{"name": NAME, "context": {"cluster": "local", "user": NAME}}],
        "current-context": NAME,
    }


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
            "hostNetwork": True,
            "dnsPolicy": "Default",  # CoreDNS forwards to the node's resolvers, never to itself
            "nodeSelector": node_selector,
            "priorityClassName": "system-cluster-critical",
            "containers": [container],
            "volumes": [{"name": "config", "configMap": {"name": NAME}}],
        },
    }


def manifests(apiserver: str, cluster_ip: str, image: str, node_selector: dict[str, str]) -> list[dict[str, Any]]:
    """Every object of the add-on: kube-system's Pod Security label, RBAC, the ConfigMap (Corefile, kubeconfig), the
    Deployment, the Service."""
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "data": {"Corefile": corefile(), "kubeconfig": json.dumps(api_kubeconfig(apiserver), indent=2)},
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
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
    }
    return [namespace, *_rbac(), config_map, deployment, service]


@dataclass(frozen=True)
class ClusterDNS:
    """Where the cluster's DNS answers: the Service's ClusterIP (port 53) and the server's own port on its pod."""

    cluster_ip: str
    pod_port: int = DNS_PORT


def install_coredns(control_plane_dir: Path, bin_dir: Path, node_selector: dict[str, str] | None = None) -> ClusterDNS:
    """Apply CoreDNS to the control plane of ``control_plane_dir`` (server-side, so a second install changes
    nothing); its nodes must have imported the image (:func:`coredns_image`). Returns where it answers."""
    config = json.loads((control_plane_dir / "config.json").read_text())
    gateway = NODE_NETWORK.network_address + 1  # where the nodes reach the API server (network.py)
    apiserver = f"https://{gateway}:{int(config['apiserverPort'])}"
    cluster_ip = cluster_dns_ip(str(config["serviceCIDR"]))
    objects = manifests(apiserver, cluster_ip, image_ref(bin_dir), node_selector or {})
    apply(control_plane_dir / "admin.kubeconfig", objects)
    return ClusterDNS(cluster_ip)
