"""The children of a PostgresPooler (pure builders): the Deployment, the Service, the ConfigMap and two Secrets.

The pods run :func:`image`: ``KANRI_PGBOUNCER_IMAGE`` (the chart's built ``kanri-pgbouncer``, by digest), else
``kanri.dev/pgbouncer:1.18`` (the home-made node maps it to Debian's pgbouncer; docs/images.md), as a
non-root user with a read-only root filesystem, no service account token and no capability. They are spread over
zones and nodes (preferred, as the cluster's instances). The pod template carries :data:`names.CONFIG_HASH`: a new
pgbouncer.ini, auth file or certificate rolls the pods one at a time, a new one ready before an old one goes.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from kanri.contract.pooler import PRIMARY_CHECK_ENV
from kanri.postgres.api.v1alpha1.postgres_pooler import PostgresPoolerSpec
from kanri.postgres.api.v1alpha1.storage import Resources
from kanri.postgres.pooler import names
from kanri.postgres.pooler.config import AUTH_DIR, AUTH_FILE, CONFIG_DIR, CONFIG_FILE, PORT, TLS_DIR, target

__all__ = [
    "IMAGE",
    "IMAGE_ENV",
    "METRICS_PORT",
    "UID",
    "auth_secret",
    "config_map",
    "deployment",
    "dns_names",
    "image",
    "primary_check",
    "service",
    "tls_secret",
]

Obj = dict[str, Any]
IMAGE = "kanri.dev/pgbouncer:1.18"
IMAGE_ENV = "KANRI_PGBOUNCER_IMAGE"
"""The pods' image reference the chart sets on the operator (values ``postgres.pgbouncer``), so a real cluster pulls
the built ``kanri-pgbouncer``; unset or empty: :data:`IMAGE` (the home-made node's name)."""
UID = 70
METRICS_PORT = 9127
"""The agent's Prometheus endpoint (``/metrics``: kanri.postgres.pooler.agent.metrics)."""
"""The image's ``pgbouncer`` user (and group)."""
DEFAULT_REQUESTS = {"cpu": "50m", "memory": "64Mi"}
"""What a PgBouncer container requests for each resource ``spec.resources`` names neither a request nor a limit of
(never BestEffort; PgBouncer is one small single-threaded process)."""
SPREAD_KEYS = ("topology.kubernetes.io/zone", "kubernetes.io/hostname")


def image(environ: Mapping[str, str]) -> str:
    """The pods' image: ``environ[IMAGE_ENV]`` when set and not empty, else :data:`IMAGE`."""
    return environ.get(IMAGE_ENV, "").strip() or IMAGE


def _meta(name: str, pooler: str, namespace: str) -> Obj:
    return {"name": name, "namespace": namespace, "labels": names.LABELS.labels(pooler)}


def dns_names(pooler: str, namespace: str) -> list[str]:
    """Every name a client may use for the pooler's Service."""
    service = names.service(pooler)
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def config_map(pooler: str, namespace: str, ini: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(names.config_map(pooler), pooler, namespace),
            "data": {CONFIG_FILE: ini}}  # fmt: skip


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def auth_secret(pooler: str, namespace: str, password: str, auth_file: str) -> Obj:
    """``password`` of the lookup role (the operator reads it to send its verifier) and the pods' auth file."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(names.auth_secret(pooler), pooler, namespace),
            "data": {"password": _b64(password.encode()), AUTH_FILE: _b64(auth_file.encode())}}  # fmt: skip


def tls_secret(pooler: str, namespace: str, cert: bytes, key: bytes, ca_cert: bytes) -> Obj:
    """The server certificate clients verify, and the cluster's CA PgBouncer verifies PostgreSQL against."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": _meta(names.tls_secret(pooler), pooler, namespace),
            "data": {"tls.crt": _b64(cert), "tls.key": _b64(key), "ca.crt": _b64(ca_cert)}}  # fmt: skip


def service(pooler: str, namespace: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(names.service(pooler), pooler, namespace),
        "spec": {
            "selector": names.LABELS.selector(pooler),
            "ports": [{"name": "pgbouncer", "port": PORT, "targetPort": "pgbouncer", "protocol": "TCP"}],
        },
    }


def _volume(name: str, path: str, source: Obj) -> tuple[Obj, Obj]:
    return {"name": name, **source}, {"name": name, "mountPath": path, "readOnly": True}


def _mounted(pooler: str) -> list[tuple[Obj, Obj]]:
    """(volume, mount) of pgbouncer.ini, the auth file (that key only) and the certificates."""
    return [
        _volume("config", CONFIG_DIR, {"configMap": {"name": names.config_map(pooler)}}),
        _volume(
            "auth",
            AUTH_DIR,
            {
                "secret": {
                    "secretName": names.auth_secret(pooler),
                    "defaultMode": 0o440,
                    "items": [{"key": AUTH_FILE, "path": AUTH_FILE}],
                }
            },
        ),
        _volume("tls", TLS_DIR, {"secret": {"secretName": names.tls_secret(pooler), "defaultMode": 0o440}}),
    ]


def _resources(resources: Resources | None) -> dict[str, dict[str, str]]:
    requests = dict(resources.requests) if resources else {}
    limits = dict(resources.limits) if resources else {}
    for name, quantity in DEFAULT_REQUESTS.items():
        if name not in requests and name not in limits:
            requests[name] = quantity
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def primary_check(spec: PostgresPoolerSpec, namespace: str, database: str) -> str | None:
    """What the agent looks through to follow the primary (``KANRI_POOLER_PRIMARY_CHECK``): the Service PgBouncer
    uses and the database the lookup role is made in; None for an ``ro`` pooler (no primary to follow)."""
    if spec.type != "rw":
        return None
    where = target(spec.cluster, namespace, spec.type)
    return f"host={where.host} port={where.port} dbname={database}"


def _container(spec: PostgresPoolerSpec, image: str, mounts: list[Obj], check: str | None) -> Obj:
    """PgBouncer with the pod's pgbouncer.ini; ready and alive while it accepts TCP connections."""
    probe = {"tcpSocket": {"port": "pgbouncer"}, "periodSeconds": 5, "timeoutSeconds": 2}
    env = [] if check is None else [{"name": PRIMARY_CHECK_ENV, "value": check}]
    return {
        "name": "pgbouncer",
        "image": image,
        "args": [f"{CONFIG_DIR}/{CONFIG_FILE}"],
        **({"env": env} if env else {}),
        "ports": [
            {"name": "pgbouncer", "containerPort": PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {**probe, "failureThreshold": 2},
        "livenessProbe": {**probe, "failureThreshold": 6, "initialDelaySeconds": 5},
        "resources": _resources(spec.resources),
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def deployment(pooler: str, namespace: str, spec: PostgresPoolerSpec, config_hash: str, image: str = IMAGE,
               database: str = "app") -> Obj:  # fmt: skip
    """``spec.instances`` PgBouncer pods reading pgbouncer.ini, the auth file and the certificates from volumes;
    ``database``: where the lookup role is made (the agent's primary check logs in there)."""
    selector = names.LABELS.selector(pooler)
    mounted = _mounted(pooler)
    container = _container(spec, image, [mount for _, mount in mounted], primary_check(spec, namespace, database))
    spread = [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
               "labelSelector": {"matchLabels": selector}} for key in SPREAD_KEYS]  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(names.deployment(pooler), pooler, namespace),
        "spec": {
            "replicas": spec.instances,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": names.LABELS.labels(pooler), "annotations": {names.CONFIG_HASH: config_hash}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": UID,
                        "runAsGroup": UID,
                        "fsGroup": UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "topologySpreadConstraints": spread,
                    "containers": [container],
                    "volumes": [volume for volume, _ in mounted],
                },
            },
        },
    }
