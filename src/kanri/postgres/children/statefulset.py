"""One StatefulSet per instance (``<cluster>-<n>``, pod ``<cluster>-<n>-0``): the pod the instance manager runs in.

One StatefulSet per instance rather than one for the cluster (as Crunchy PGO): each instance can be stopped,
removed or restarted on its own, scale-down picks *which* replica goes (a single StatefulSet always removes the
highest ordinal, which may be the primary), and the claim is the operator's, not a template's.

The pod follows the contract with the instance manager (``python -m kanri.instance`` in image
``kanri.dev/postgres:<major>``): environment, mounts and probes below.
"""

from __future__ import annotations

from typing import Any

from kanri.postgres import names
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.api.v1alpha1.storage import container_resources
from kanri.postgres.children import child_meta, owned
from kanri.postgres.children.images import DEFAULT_IMAGES, INSTANCE_IMAGE, PostgresImages, tag_major
from kanri.postgres.labels import PRIMARY, REPLICA, Role, cluster_selector, instance_labels, instance_selector

__all__ = [
    "BOOTSTRAP_ENV",
    "HTTP_PORT",
    "IMAGE",
    "POSTGRES_UID",
    "RESTART",
    "SPREAD_TOPOLOGY_KEYS",
    "affinity",
    "bootstrap_role",
    "container_security",
    "environment",
    "image_major",
    "image_of",
    "one_shot_spec",
    "pod_security",
    "postgres_image",
    "statefulset",
    "tag_major",
    "volumes",
]

Obj = dict[str, Any]

IMAGE = INSTANCE_IMAGE
HTTP_PORT = 8008
METRICS_PORT = 9187
"""The instance exporter's port (kanri.instance.exporter; the operator does not import the instance package)."""
POSTGRES_UID = 26  # the image's postgres user (as in the Red Hat / Crunchy images)
BOOTSTRAP_ENV = "KANRI_BOOTSTRAP"

DATA_DIR = "/var/lib/postgresql/data"
SOCKET_DIR = "/var/run/postgresql"
TMP_DIR = "/run/kanri-tmp"
"""The pod's scratch space (an emptyDir, ``TMPDIR``): the root filesystem, /tmp included, is read-only."""
SUPERUSER_DIR = "/etc/kanri/superuser"
REPLICATION_DIR = "/etc/kanri/replication"
APP_DIR = "/etc/kanri/app"
API_DIR = "/etc/kanri/api"
CONFIG_DIR = "/etc/kanri/config"
TLS_DIR = "/etc/kanri/tls"
BACKUP_DIR = "/etc/kanri/backup"
RECOVERY_DIR = "/etc/kanri/recovery"

SPREAD_TOPOLOGY_KEYS = ("kubernetes.io/hostname", "topology.kubernetes.io/zone")
"""The default anti-affinity spreads a cluster's instances over these (nodes first, zones as well)."""


def pod_security() -> Obj:
    """The pod securityContext every PostgreSQL pod the operator makes shares (instances, restore rehearsals, upgrade
    pods): non-root as the image's postgres user, whose group owns the volumes, and RuntimeDefault seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": POSTGRES_UID,
        "runAsGroup": POSTGRES_UID,
        "fsGroup": POSTGRES_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def one_shot_spec(cluster: str, container: Obj, pod_volumes: list[Obj]) -> Obj:
    """The spec of a pod that runs once and answers in its termination message (restore rehearsal, upgrade check,
    upgrade): never restarted, no service account token or Service variables, restricted like the instance pods."""
    return {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "serviceAccountName": names.service_account(cluster),
        "securityContext": pod_security(),
        "containers": [container],
        "volumes": pod_volumes,
    }


def container_security() -> Obj:
    """Pod Security Standards ``restricted`` (with the pod's runAsNonRoot and seccompProfile). The root filesystem is
    read-only: the instance manager and PostgreSQL write only under the data volume and the socket dir (an emptyDir)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _field(path: str) -> Obj:
    return {"fieldRef": {"fieldPath": path}}


def environment(cluster: str, instance: str, role: Role, spec: PostgresClusterSpec) -> list[Obj]:
    """The instance manager's environment. ``role`` is how the instance bootstraps an empty volume: ``primary``
    runs initdb, ``replica`` clones from ``<cluster>-rw``."""
    database = spec.bootstrap.initdb.database if spec.bootstrap.initdb else "app"
    plain = {
        "KANRI_CLUSTER": cluster,
        "POD_NAME": instance,
        "PGDATA": f"{DATA_DIR}/pgdata",
        BOOTSTRAP_ENV: role,
        "KANRI_PRIMARY_HOST": names.read_write_service(cluster),
        "KANRI_SUPERUSER_DIR": SUPERUSER_DIR,
        "KANRI_REPLICATION_DIR": REPLICATION_DIR,
        "KANRI_APP_DIR": APP_DIR,
        "KANRI_APP_DATABASE": database,
        "KANRI_API_TOKEN_FILE": f"{API_DIR}/token",
        "KANRI_CONFIG_FILE": f"{CONFIG_DIR}/instance.json",
        **_tls_environment(),
        "TMPDIR": TMP_DIR,  # for every program the manager runs (Barman Cloud's staging files)
    }
    if spec.backup is not None:
        plain["KANRI_BACKUP_CREDENTIALS_DIR"] = BACKUP_DIR
    if spec.bootstrap.recovery is not None:
        plain["KANRI_RECOVERY_CREDENTIALS_DIR"] = RECOVERY_DIR
    env: list[Obj] = [{"name": key, "value": value} for key, value in plain.items()]
    env[2:2] = [
        {"name": "POD_NAMESPACE", "valueFrom": _field("metadata.namespace")},
        {"name": "POD_IP", "valueFrom": _field("status.podIP")},
    ]
    return env


def volumes(cluster: str, instance: str, backup: bool = False, recovery: bool = False) -> tuple[list[Obj], list[Obj]]:
    """The pod's volumes and the container's mounts: data claim, the four Secrets, the ConfigMap, the socket dir, the
    scratch dir (:data:`TMP_DIR`); with ``backup``, the repository's key pair the operator copies (optional: absent
    while there is no repository); with ``recovery`` (bootstrap.recovery), the source repository's key pair."""
    secrets = [
        ("superuser", names.superuser_secret(cluster), SUPERUSER_DIR),
        ("replication", names.replication_secret(cluster), REPLICATION_DIR),
        ("app", names.app_secret(cluster), APP_DIR),
        ("api", names.api_secret(cluster), API_DIR),
    ]
    pod_volumes: list[Obj] = [{"name": "data", "persistentVolumeClaim": {"claimName": instance}}]
    mounts: list[Obj] = [{"name": "data", "mountPath": DATA_DIR}]
    for volume, secret, path in secrets:
        pod_volumes.append({"name": volume, "secret": {"secretName": secret}})
        mounts.append({"name": volume, "mountPath": path, "readOnly": True})
    _tls_volume(cluster, pod_volumes, mounts)
    if backup:
        pod_volumes.append({"name": "backup", "secret": {"secretName": names.backup_secret(cluster), "optional": True}})
        mounts.append({"name": "backup", "mountPath": BACKUP_DIR, "readOnly": True})
    if recovery:
        source = {"secretName": names.recovery_secret(cluster), "optional": True}
        pod_volumes.append({"name": "recovery", "secret": source})
        mounts.append({"name": "recovery", "mountPath": RECOVERY_DIR, "readOnly": True})
    pod_volumes.append({"name": "config", "configMap": {"name": names.config_map(cluster)}})
    mounts.append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
    pod_volumes.append({"name": "run", "emptyDir": {}})
    mounts.append({"name": "run", "mountPath": SOCKET_DIR})
    # The root filesystem is read-only: barman-cloud-backup makes its staging directory with Python's tempfile at
    # start and found no writable candidate (/tmp, /var/tmp, the working directory) on a real kubelet, so every base
    # backup failed. Not mounted at /tmp: the local node binds a checkout that lives under /tmp there.
    pod_volumes.append({"name": "tmp", "emptyDir": {}})
    mounts.append({"name": "tmp", "mountPath": TMP_DIR})
    return pod_volumes, mounts


def _tls_environment() -> dict[str, str]:
    """TLS (docs/security.md): where the server certificate Secret is mounted."""
    return {"KANRI_TLS_DIR": TLS_DIR}


def _tls_volume(cluster: str, pod_volumes: list[Obj], mounts: list[Obj]) -> None:
    """The server certificate Secret (``tls.crt``, ``tls.key``, ``ca.crt``), read-only; the instance manager copies
    it to a 0600 file PostgreSQL accepts (:mod:`kanri.instance.tls`)."""
    pod_volumes.append({"name": "tls", "secret": {"secretName": names.server_secret(cluster), "defaultMode": 0o440}})
    mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})


def _probe(path: str, period: int, failures: int) -> Obj:
    # HTTPS: the instance manager serves its API with the server certificate; the kubelet does not verify it
    action = {"path": path, "port": HTTP_PORT, "scheme": "HTTPS"}
    return {"httpGet": action, "periodSeconds": period, "failureThreshold": failures}


def _container(cluster: str, instance: str, role: Role, image: str, spec: PostgresClusterSpec) -> Obj:
    _, mounts = volumes(cluster, instance, spec.backup is not None, spec.bootstrap.recovery is not None)
    container: Obj = {
        "name": "postgres",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "env": environment(cluster, instance, role, spec),
        "ports": [
            {"name": "postgres", "containerPort": 5432, "protocol": "TCP"},
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},  # the instance exporter
        ],
        "readinessProbe": _probe("/readyz", 2, 3),
        "livenessProbe": _probe("/healthz", 10, 3),
        # Cloning a large primary or replaying WAL can take long: up to 10 minutes before liveness applies.
        "startupProbe": _probe("/healthz", 5, 120),
        "volumeMounts": mounts,
        # A failed run's last log lines land in its terminated state: the operator quotes them (CrashLoopBackOff).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(),
    }
    # Never BestEffort: default requests where the spec names none (issue 33, DEFAULT_REQUESTS says why)
    container["resources"] = container_resources(spec.resources)
    return container


def _default_anti_affinity(cluster: str, by_app: bool) -> Obj:
    """Prefer a node, then a zone, without another instance of the cluster (as CloudNativePG's default). Preferred,
    not required: a one-node development cluster must still run three instances."""
    peers = {"matchLabels": cluster_selector(cluster, by_app=by_app)}
    terms = [
        {"weight": 100, "podAffinityTerm": {"labelSelector": peers, "topologyKey": key}} for key in SPREAD_TOPOLOGY_KEYS
    ]
    return {"preferredDuringSchedulingIgnoredDuringExecution": terms}


def affinity(cluster: str, spec: PostgresClusterSpec, *, by_app: bool = True) -> Obj:
    """The pod's affinity: the user's ``podTemplate.affinity``, with the default anti-affinity unless it says
    ``podAntiAffinity`` itself (an empty one turns the spreading off); a node affinity alone keeps the spreading.
    ``by_app``: the spreading counts the cluster's pods by app name too (as :func:`statefulset`'s)."""
    template = spec.pod_template
    wanted: Obj = dict(template.affinity) if template and template.affinity else {}
    if "podAntiAffinity" not in wanted:
        wanted["podAntiAffinity"] = _default_anti_affinity(cluster, by_app)
    elif not wanted["podAntiAffinity"]:
        del wanted["podAntiAffinity"]
    return wanted


def _pod_spec(cluster: str, instance: str, role: Role, image: str, spec: PostgresClusterSpec, by_app: bool) -> Obj:
    pod_volumes, _ = volumes(cluster, instance, spec.backup is not None, spec.bootstrap.recovery is not None)
    template = spec.pod_template
    pod: Obj = {
        "serviceAccountName": names.service_account(cluster),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,  # no Service variables in PostgreSQL's environment
        "terminationGracePeriodSeconds": 60,
        "securityContext": pod_security(),
        "containers": [_container(cluster, instance, role, image, spec)],
        "volumes": pod_volumes,
    }
    if wanted_affinity := affinity(cluster, spec, by_app=by_app):
        pod["affinity"] = wanted_affinity
    if template is not None:
        if template.node_selector:
            pod["nodeSelector"] = dict(template.node_selector)
        if template.tolerations:
            pod["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in template.tolerations]
        if template.topology_spread_constraints:
            pod["topologySpreadConstraints"] = list(template.topology_spread_constraints)
        if template.priority_class_name:
            pod["priorityClassName"] = template.priority_class_name
    return pod


RESTART = "kanri.dev/restart"
"""Annotation on a PostgresCluster: any new value restarts every instance, one at a time, replicas first (``kubectl
annotate pgc NAME kanri.dev/restart=$(date +%s) --overwrite``, or ``kanri restart NAME``); copied into the pod
templates, as ``kubectl rollout restart`` does with its own annotation."""


def statefulset(
    cluster: Obj,
    spec: PostgresClusterSpec,
    instance: str,
    *,
    role: Role,
    image: str,
    running: bool,
    by_app: bool = True,
) -> Obj:
    """The StatefulSet of ``instance``: 1 replica (0 while hibernated), its own claim, owned by the cluster, running
    ``image`` (:func:`postgres_image`).

    ``by_app``: it selects its pod by app name too. False only for a StatefulSet made before that label existed:
    its selector cannot change in place, and its pod template keeps the labels and spreading it had — adding them
    would restart every instance of every older cluster; the operator labels their pods in place instead."""
    name = cluster["metadata"]["name"]
    labels = instance_labels(name, instance)
    template = spec.pod_template
    pod_labels = {**(dict(template.labels) if template else {}), **instance_labels(name, instance, by_app=by_app)}
    pod_meta: Obj = {"labels": pod_labels}
    annotations = dict(template.annotations) if template and template.annotations else {}
    restart = (cluster["metadata"].get("annotations") or {}).get(RESTART)
    if restart:
        # A new value changes every pod template: the ordinary rollout restarts the instances one at a time.
        annotations[RESTART] = restart
    if annotations:
        pod_meta["annotations"] = annotations
    body = {
        "replicas": 1 if running else 0,
        "selector": {"matchLabels": instance_selector(name, instance, by_app=by_app)},
        "serviceName": names.read_service(name),
        "podManagementPolicy": "Parallel",
        "updateStrategy": {"type": "RollingUpdate"},
        "template": {"metadata": pod_meta, "spec": _pod_spec(name, instance, role, image, spec, by_app)},
    }
    return owned("apps/v1", "StatefulSet", child_meta(cluster, instance, labels), spec=body)


def _container_of(sts: Obj) -> Obj | None:
    for container in (((sts.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or ():
        if container.get("name") == "postgres":
            return dict(container)
    return None


def bootstrap_role(sts: Obj) -> Role | None:
    """The ``KANRI_BOOTSTRAP`` an existing StatefulSet was given. It is kept for the StatefulSet's life: changing it
    after a failover would roll the pod for nothing (it only matters for an empty volume)."""
    container = _container_of(sts)
    for env in (container or {}).get("env") or ():
        if env.get("name") == BOOTSTRAP_ENV and env.get("value") in (PRIMARY, REPLICA):
            role: Role = env["value"]
            return role
    return None


def image_of(sts: Obj) -> str:
    """The image of an existing StatefulSet's PostgreSQL container ("" without one)."""
    return str((_container_of(sts) or {}).get("image") or "")


def image_major(sts: Obj) -> int | None:
    """The PostgreSQL major an existing StatefulSet runs (from its image tag)."""
    return tag_major(image_of(sts))


def postgres_image(
    spec: PostgresClusterSpec, major: int, current: Obj | None, images: PostgresImages = DEFAULT_IMAGES
) -> str:
    """The image an instance's StatefulSet runs on data of ``major``.

    While the data is of ``spec.version`` that is ``spec.imageName`` (a pinned minor), else the major's default
    image, the platform's newest minor. While it is not (a major upgrade waits for approval or runs), the instance
    keeps the image it has when that is of the data's major: ``imageName`` names the next major's image then, and
    falling back to the default would be a minor update nobody asked for. The default image of a major is the
    platform's (``images``, :mod:`kanri.postgres.children.images`)."""
    if major == spec.version:
        return spec.image_name or images.for_major(major)
    if current is not None and image_major(current) == major:
        return image_of(current)
    return images.for_major(major)
