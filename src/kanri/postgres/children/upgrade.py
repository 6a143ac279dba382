"""The major upgrade's one-off pods, image ``kanri.dev/postgres-upgrade:<to>`` (both majors' programs):

- ``<cluster>-upgrade-check``: ``kanri-instance upgrade-check`` (:mod:`kanri.instance.upgrade_check`) while the
  cluster serves — a schema-only copy of the primary's catalog in an emptyDir, and ``pg_upgrade --check``. It reads
  the superuser Secret and the server certificate (to verify the primary) and reaches the primary through ``-rw``.
- ``<cluster>-upgrade``: ``kanri-instance upgrade`` (:mod:`kanri.instance.major_upgrade`) on the primary's claim, with
  every instance stopped; mounted as the instance's own pod mounts it (the old postgresql.conf names those files).

Both never restart (restartPolicy Never: the operator reads the verdict from the termination message and decides),
are restricted like the instance pods, and carry the cluster label but no role label (no Service selects them).
"""

from __future__ import annotations

from typing import Any

from kanri.postgres import names
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.children import child_meta
from kanri.postgres.children.images import DEFAULT_IMAGES, UPGRADE_IMAGE, PostgresImages
from kanri.postgres.children.statefulset import (
    DATA_DIR,
    SOCKET_DIR,
    SUPERUSER_DIR,
    TLS_DIR,
    container_security,
    environment,
    one_shot_spec,
    volumes,
)
from kanri.postgres.labels import REPLICA, cluster_labels

__all__ = ["UPGRADE_IMAGE", "UPGRADE_LABEL", "check_pod", "upgrade_pod"]

Obj = dict[str, Any]
UPGRADE_LABEL = "kanri.dev/upgrade"
"""The pods' label: ``check`` or ``upgrade``."""


def _pod(cluster: Obj, name: str, kind: str, container: Obj, pod_volumes: list[Obj]) -> Obj:
    meta = child_meta(cluster, name, {**cluster_labels(cluster["metadata"]["name"]), UPGRADE_LABEL: kind})
    spec = one_shot_spec(cluster["metadata"]["name"], container, pod_volumes)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _container(name: str, image: str, args: list[str], env: list[Obj], mounts: list[Obj]) -> Obj:
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": env,
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(),
    }


def _versions(old: int, to: int) -> list[Obj]:
    return [{"name": "KANRI_UPGRADE_FROM", "value": str(old)}, {"name": "KANRI_UPGRADE_TO", "value": str(to)}]


def check_pod(cluster: Obj, old: int, to: int, scratch: str = "8Gi", images: PostgresImages = DEFAULT_IMAGES) -> Obj:
    """The check's pod; ``scratch`` bounds its emptyDir (a catalog copy is small; the kubelet evicts beyond it)."""
    name = cluster["metadata"]["name"]
    pod = names.upgrade_check_pod(name)
    plain = {
        "KANRI_CLUSTER": name,
        "POD_NAME": pod,
        "PGDATA": f"{DATA_DIR}/pgdata",
        "KANRI_PRIMARY_HOST": names.read_write_service(name),
        "KANRI_SUPERUSER_DIR": SUPERUSER_DIR,
        "KANRI_TLS_DIR": TLS_DIR,
        "KANRI_SOCKET_DIR": SOCKET_DIR,
        "KANRI_LISTEN_ADDRESS": "127.0.0.1",
    }
    env = [{"name": k, "value": v} for k, v in plain.items()] + _versions(old, to)
    mounts: list[Obj] = [
        {"name": "data", "mountPath": DATA_DIR},
        {"name": "run", "mountPath": SOCKET_DIR},
        {"name": "superuser", "mountPath": SUPERUSER_DIR, "readOnly": True},
        {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
    ]
    pod_volumes: list[Obj] = [
        {"name": "data", "emptyDir": {"sizeLimit": scratch}},
        {"name": "run", "emptyDir": {}},
        {"name": "superuser", "secret": {"secretName": names.superuser_secret(name)}},
        {"name": "tls", "secret": {"secretName": names.server_secret(name), "defaultMode": 0o440}},
    ]
    return _pod(
        cluster,
        pod,
        "check",
        _container("upgrade-check", images.for_upgrade(to), ["upgrade-check"], env, mounts),
        pod_volumes,
    )


def upgrade_pod(
    cluster: Obj, spec: PostgresClusterSpec, instance: str, old: int, to: int, images: PostgresImages = DEFAULT_IMAGES
) -> Obj:
    """The upgrade's pod on ``instance``'s claim (the primary's), mounted as that instance's pod mounts it."""
    name = cluster["metadata"]["name"]
    pod_volumes, mounts = volumes(name, instance, spec.backup is not None, spec.bootstrap.recovery is not None)
    env = environment(name, instance, REPLICA, spec) + _versions(old, to)
    container = _container("upgrade", images.for_upgrade(to), ["upgrade"], env, mounts)
    return _pod(cluster, names.upgrade_pod(name), "upgrade", container, pod_volumes)
