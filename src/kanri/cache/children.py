"""What the operator writes for a Cache (pure builders of the desired objects; the steps write them).

- ``<name>-config`` ConfigMap: valkey.conf and Sentinel's template, derived from the policy (:mod:`kanri.cache.config`).
- ``<name>-password`` Secret: generated once, never owned (``deletionPolicy`` decides), mounted as a file.
- Services: ``<name>-hl`` (headless, every pod's stable DNS name, ready or not: the agents and Sentinels use them),
  ``<name>-rw`` (the primary), ``<name>-ro`` (the readable pods per ``readPolicy``), ``<name>-sentinel``.
  ``-rw`` and ``-ro`` select the role labels the operator puts on pods (:data:`ROLE`, :data:`READABLE`).
- ``<name>`` StatefulSet: one pod per replica, each running the agent's server (container ``valkey``) and a Sentinel
  (container ``sentinel``), so failover needs no operator; Durable pods claim a volume each. ``updateStrategy`` is
  ``OnDelete``: the operator decides the order pods are replaced in (:mod:`kanri.cache.rollout`).
- ``<name>-agent`` ServiceAccount, Role and RoleBinding: the agent in each pod keeps its own pod's :data:`ROLE` label
  true while the operator is down, so the Role allows ``get``/``patch`` on exactly this Cache's pods, nothing else.
  Only the ``valkey`` container gets the token (a projected volume; Sentinel has none).
"""

from __future__ import annotations

import secrets
from typing import Any

from kanri.cache.api import LABELS, CacheSpec
from kanri.cache.config import SENTINEL_PORT, VALKEY_PORT, sentinel_config, server_config
from kanri.kit import image_for
from kanri.runtime import child_name

__all__ = [
    "AGENT_TOKEN_DIR",
    "IMAGE",
    "READABLE",
    "ROLE",
    "VALKEY_UID",
    "agent_role",
    "agent_role_binding",
    "agent_service_account",
    "config_map",
    "password_secret",
    "pod_address",
    "services",
    "statefulset",
]

Obj = dict[str, Any]
IMAGE = "kanri.dev/valkey"
IMAGES_ENV = "KANRI_VALKEY_IMAGES"
"""A JSON table version -> image reference the chart sets on the operator (values ``cache``), so a real
cluster pulls from a registry of its own; a version it does not list runs ``IMAGE:<version>`` (the local cluster's
name)."""
VALKEY_UID = 999
ROLE = LABELS.key("role")
"""On each pod: ``primary`` or ``replica``, as the pod's server reports it; set by the pod's own agent (also while
the operator is down) and by the operator (also for a pod whose agent is gone). ``-rw`` selects ``primary``."""
READABLE = LABELS.key("readable")
"""On each pod: ``"true"`` when ``readPolicy`` lets ``-ro`` send reads to it; added by the operator only, removed by
the operator and by the pod's own agent once its server is past ``maxLagSeconds`` (:mod:`kanri.cache.agent.readable`,
which names the same key)."""
PASSWORD_KEY = "password"
CONFIG_DIR = "/etc/cache/config"
SECRET_DIR = "/etc/cache/secret"
DATA_DIR = "/data"
RUN_DIR = "/run/cache"
SENTINEL_DIR = "/sentinel"
AGENT_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where the valkey container finds its token, CA and namespace (where in-cluster clients look)."""
TOKEN_SECONDS = 3607


def config_name(cache: str) -> str:
    return child_name(cache, "config")


def password_name(cache: str) -> str:
    return child_name(cache, "password")


def headless_name(cache: str) -> str:
    return child_name(cache, "hl")


def agent_name(cache: str) -> str:
    """The ServiceAccount, Role and RoleBinding the pods' agents use."""
    return child_name(cache, "agent")


def agent_service_account(cache: str) -> Obj:
    return {
        "metadata": {"name": agent_name(cache), "labels": LABELS.labels(cache)},
        "automountServiceAccountToken": False,  # mounted by hand, into the valkey container only
    }


def agent_role(cache: str, pods: int) -> Obj:
    """``get``/``patch`` on pods ``<cache>-0`` .. ``<cache>-<pods - 1>`` (the StatefulSet's count, so a pod kept
    during a scale-down can still label itself)."""
    names = [f"{cache}-{index}" for index in range(pods)]
    rule = {"apiGroups": [""], "resources": ["pods"], "resourceNames": names, "verbs": ["get", "patch"]}
    return {"metadata": {"name": agent_name(cache), "labels": LABELS.labels(cache)}, "rules": [rule]}


def agent_role_binding(cache: str) -> Obj:
    return {
        "metadata": {"name": agent_name(cache), "labels": LABELS.labels(cache)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": agent_name(cache)},
        "subjects": [{"kind": "ServiceAccount", "name": agent_name(cache)}],
    }


def _token_volume() -> Obj:
    """What the kubelet would mount for ``automountServiceAccountToken``, as a volume only one container mounts;
    group-readable (``fsGroup``) for the non-root server."""
    namespace = {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
    sources = [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECONDS}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [namespace]}},
    ]
    return {"name": "api-token", "projected": {"defaultMode": 0o440, "sources": sources}}


def pod_address(cache: str, namespace: str, index: int, port: int = VALKEY_PORT) -> str:
    """``host:port`` of pod ``index`` by its stable DNS name (what the agents and Sentinels use)."""
    return f"{cache}-{index}.{headless_name(cache)}.{namespace}.svc.cluster.local:{port}"


def config_map(cache: str, spec: CacheSpec) -> Obj:
    return {
        "metadata": {"name": config_name(cache), "labels": LABELS.labels(cache)},
        "data": {
            "valkey.conf": "\n".join(server_config(spec)) + "\n",
            "sentinel.conf": "\n".join(sentinel_config(cache, spec)) + "\n",
        },
    }


def password_secret(cache: str) -> Obj:
    """Generated once (create-once): the value never leaves the Secret but as a mounted file."""
    return {
        "metadata": {"name": password_name(cache), "labels": LABELS.labels(cache)},
        "stringData": {PASSWORD_KEY: secrets.token_urlsafe(32)},
    }


def _service(cache: str, suffix: str, selector: Obj, port: int, **extra: Any) -> Obj:
    return {
        "metadata": {"name": child_name(cache, suffix), "labels": LABELS.labels(cache)},
        "spec": {"selector": selector, "ports": [{"name": "valkey", "port": port, "targetPort": port}], **extra},
    }


def services(cache: str) -> list[Obj]:
    pods = LABELS.selector(cache)
    headless = _service(cache, "hl", pods, VALKEY_PORT, clusterIP="None", publishNotReadyAddresses=True)
    headless["spec"]["ports"].append({"name": "sentinel", "port": SENTINEL_PORT, "targetPort": SENTINEL_PORT})
    return [
        headless,
        _service(cache, "rw", pods | {ROLE: "primary"}, VALKEY_PORT),
        _service(cache, "ro", pods | {READABLE: "true"}, VALKEY_PORT),
        _service(cache, "sentinel", pods, SENTINEL_PORT),
    ]


def _container(name: str, mode: str, cache: str, spec: CacheSpec, port: int) -> Obj:
    env = [
        {"name": "CACHE_NAME", "value": cache},
        {"name": "CACHE_REPLICAS", "value": str(spec.replicas)},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "CACHE_SERVICE", "value": headless_name(cache)},
        {"name": "CACHE_ROLE_LABEL", "value": ROLE},
    ]
    mounts = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "password", "mountPath": SECRET_DIR, "readOnly": True},
        {"name": "data", "mountPath": DATA_DIR},
        {"name": "run", "mountPath": RUN_DIR},
        {"name": "sentinel", "mountPath": SENTINEL_DIR},
    ]
    if name == "valkey":  # the agent labels its pod; Sentinel talks to no API server
        mounts.append({"name": "api-token", "mountPath": AGENT_TOKEN_DIR, "readOnly": True})
    container: Obj = {
        "name": name,
        "image": image_for(IMAGES_ENV, IMAGE, spec.version),
        "args": [mode],
        "env": env,
        "ports": [{"name": name, "containerPort": port}],
        "volumeMounts": mounts,
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if name == "valkey" and spec.resources is not None:
        container["resources"] = {k: dict(v) for k, v in (("requests", spec.resources.requests),
                                                            ("limits", spec.resources.limits)) if v}  # fmt: skip
    return container


def statefulset(cache: str, spec: CacheSpec, replicas: int | None = None, claim_size: str | None = None) -> Obj:
    """``replicas``: the pod count when it must differ from ``spec.replicas`` (a scale-down keeps the primary's pod
    until the primary has been switched over to a pod that stays); ``claim_size``: the existing StatefulSet's claim
    template size (it cannot change: the claims themselves are grown, kanri.kit.grow_claims)."""
    volumes: list[Obj] = [
        {"name": "config", "configMap": {"name": config_name(cache)}},
        {"name": "password", "secret": {"secretName": password_name(cache)}},
        {"name": "run", "emptyDir": {"medium": "Memory"}},
        {"name": "sentinel", "emptyDir": {}},
        _token_volume(),
    ]
    claims: list[Obj] = []
    if spec.storage is None:
        volumes.append({"name": "data", "emptyDir": {}})
    else:
        request = claim_size or spec.storage.size
        claim_spec: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": request}}}
        if spec.storage.storage_class_name:
            claim_spec["storageClassName"] = spec.storage.storage_class_name
        claims.append({"metadata": {"name": "data", "labels": LABELS.labels(cache)}, "spec": claim_spec})
    pod_spec: Obj = {
        "serviceAccountName": agent_name(cache),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": VALKEY_UID,
            "runAsGroup": VALKEY_UID,
            "fsGroup": VALKEY_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            _container("valkey", "server", cache, spec, VALKEY_PORT),
            _container("sentinel", "sentinel", cache, spec, SENTINEL_PORT),
        ],
        "volumes": volumes,
    }
    body: Obj = {
        "metadata": {"name": cache, "labels": LABELS.labels(cache)},
        "spec": {
            "serviceName": headless_name(cache),
            "replicas": spec.replicas if replicas is None else replicas,
            # every pod starts at once: the agents, not the start order, decide who leads
            "podManagementPolicy": "Parallel",
            # the operator replaces pods (kanri.cache.rollout): replicas first, the primary after a planned switchover
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": LABELS.selector(cache)},
            "template": {"metadata": {"labels": LABELS.labels(cache)}, "spec": pod_spec},
            # Retain: the volumes stay when the StatefulSet goes; deletionPolicy decides (kit.carry_out)
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
        },
    }
    if claims:
        body["spec"]["volumeClaimTemplates"] = claims
    return body
