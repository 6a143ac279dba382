"""The restore rehearsal's throwaway Pod ``<cluster>-restore-test``: the instance image running ``kanri-instance
restore-test`` (:mod:`kanri.instance.rehearsal`) once, never restarted.

It restores into an emptyDir (nothing of it outlives the pod), reads the cluster's own ``instance.json`` (its
``archive`` entry is the repository to restore from; the restored server never archives) and the cluster's copied
repository key pair, and answers in its termination message. Restricted like the instance pods: non-root uid 26,
no privilege escalation, read-only root filesystem, every capability dropped, RuntimeDefault seccomp, no service
account token. It carries the cluster label (so the operator's pod watch sees it) but no role label, so no Service
selects it.
"""

from __future__ import annotations

from typing import Any

from kanri.postgres import names
from kanri.postgres.children import child_meta
from kanri.postgres.children.images import DEFAULT_IMAGES, PostgresImages
from kanri.postgres.children.statefulset import (
    BACKUP_DIR,
    CONFIG_DIR,
    DATA_DIR,
    SOCKET_DIR,
    container_security,
    one_shot_spec,
)
from kanri.postgres.labels import cluster_labels

__all__ = ["REHEARSAL", "REQUEST", "rehearsal_pod"]

Obj = dict[str, Any]
REHEARSAL = "kanri.dev/restore-test"
"""The pod's label (and, on the PostgresCluster, the annotation that asks for a rehearsal now)."""
REQUEST = "kanri.dev/restore-test-request"
"""The pod's annotation: what asked for it — the annotation's value, or ``schedule``."""


def rehearsal_pod(
    cluster: Obj, major: int, request: str, scratch: str = "8Gi", images: PostgresImages = DEFAULT_IMAGES
) -> Obj:
    """The Pod; ``request`` is recorded on it (see :data:`REQUEST`); ``scratch`` bounds the emptyDir (a restore
    larger than that is evicted by the kubelet, which the operator reports as a failed rehearsal)."""
    name = cluster["metadata"]["name"]
    meta = child_meta(cluster, names.restore_test_pod(name), {**cluster_labels(name), REHEARSAL: "true"})
    meta["annotations"] = {REQUEST: request}
    env = {
        "KANRI_CLUSTER": name,
        "POD_NAME": names.restore_test_pod(name),
        "PGDATA": f"{DATA_DIR}/pgdata",
        "KANRI_CONFIG_FILE": f"{CONFIG_DIR}/instance.json",
        "KANRI_BACKUP_CREDENTIALS_DIR": BACKUP_DIR,
        "KANRI_SOCKET_DIR": SOCKET_DIR,
        "KANRI_LISTEN_ADDRESS": "127.0.0.1",
    }
    container: Obj = {
        "name": "restore-test",
        "image": images.for_major(major),
        "imagePullPolicy": "IfNotPresent",
        "args": ["restore-test"],
        "env": [{"name": key, "value": value} for key, value in env.items()],
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "run", "mountPath": SOCKET_DIR},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "backup", "mountPath": BACKUP_DIR, "readOnly": True},
        ],
        # the verdict is the termination message; without one (killed, evicted) the log's tail stands in
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(),
    }
    spec = one_shot_spec(
        name,
        container,
        [
            {"name": "data", "emptyDir": {"sizeLimit": scratch}},
            {"name": "run", "emptyDir": {}},
            {"name": "config", "configMap": {"name": names.config_map(name)}},
            {"name": "backup", "secret": {"secretName": names.backup_secret(name)}},
        ],
    )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
