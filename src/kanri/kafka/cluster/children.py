"""What the operator writes for a KafkaCluster (pure builders; the steps write them).

- ``<name>-kraft`` ConfigMap: the KRaft cluster id and how many nodes are controller voters, written once and never
  owned (the volumes formatted with them stay with ``deletionPolicy: Retain``, and a new cluster of the same name
  must find the same id and voters).
- ``<name>-brokers``: headless, every node's stable DNS name, ready or not (the controller quorum's voters).
- ``<name>-bootstrap``: the clients' Service, ready brokers only.
- ``<name>`` StatefulSet: one node per replica — nodes ``0..controllers-1`` combined controller+broker (the
  quorum's voters), the rest brokers only — started together (a quorum needs a majority
  of voters up before any is ready), each with its volume; ``OnDelete``, so the operator restarts brokers itself,
  one at a time behind the min.insync.replicas gate. Brokers advertise their pod IP: clients outside the pod
  network's DNS (the operator, a test) reach them too.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kanri.kafka.api import CONTROLLER_LABELS, LABELS, KafkaClusterSpec
from kanri.kafka.broker.settings import new_cluster_id
from kanri.kit import image_for
from kanri.runtime import child_name

Obj = dict[str, Any]
IMAGE = "kanri.dev/kafka"
IMAGES_ENV = "KANRI_KAFKA_IMAGES"
"""A JSON table version -> image reference the chart sets on the operator (values ``kafka``), so a real
cluster pulls from a registry of its own; a version it does not list runs ``IMAGE:<version>`` (the local cluster's
name)."""
KAFKA_UID = 1001
CLIENT_PORT = 9092
CONTROLLER_PORT = 9093
TLS_PORT = 9094
TLS_DIR = "/etc/kafka/tls"
TLS_HASH = LABELS.key("tls-hash")
DATA_DIR = "/var/lib/kafka"
CONFIG_DIR = "/etc/kafka/user"
CLUSTER_ID_KEY = "clusterId"
CONTROLLERS_KEY = "controllers"
DEDICATED_KEY = "dedicatedControllers"
CONTROLLER_ID_BASE = 1000
"""Dedicated controllers' node ids start here (brokers keep 0..replicas-1)."""
CONFIG_HASH = LABELS.key("config-hash")


def kraft_name(cluster: str) -> str:
    return child_name(cluster, "kraft")


def headless_name(cluster: str) -> str:
    return child_name(cluster, "brokers")


def bootstrap_name(cluster: str) -> str:
    return child_name(cluster, "bootstrap")


def config_name(cluster: str) -> str:
    return child_name(cluster, "config")


def ca_name(cluster: str) -> str:
    """The CA certificate clients trust (``ca.crt``)."""
    return child_name(cluster, "ca")


def ca_key_name(cluster: str) -> str:
    """The CA's certificate and key: read by the operator only."""
    return child_name(cluster, "ca-key")


def tls_name(cluster: str) -> str:
    """The brokers' certificate and key (``tls.crt``, ``tls.key``, ``ca.crt``), mounted in every broker pod."""
    return child_name(cluster, "tls")


def tls_dns_names(cluster: str, namespace: str) -> list[str]:
    """What the brokers' certificate names: every pod under the headless Service (a wildcard: the names clients
    are sent to by the metadata), and the bootstrap Service in every form a client may use."""
    headless, bootstrap = headless_name(cluster), bootstrap_name(cluster)
    return [f"*.{headless}.{namespace}.svc.cluster.local", f"*.{headless}.{namespace}.svc",
            f"{bootstrap}.{namespace}.svc.cluster.local", f"{bootstrap}.{namespace}.svc",
            f"{bootstrap}.{namespace}", bootstrap]  # fmt: skip


def tls_bootstrap(cluster: str, namespace: str) -> str:
    return f"{bootstrap_name(cluster)}.{namespace}.svc:{TLS_PORT}"


def default_controllers(spec: KafkaClusterSpec) -> int:
    """The voters a new cluster gets: ``spec.controllers``, else 3 from three nodes on and 1 below (two voters
    would stop the quorum when either fails: no better than one)."""
    return spec.controllers or (3 if spec.replicas >= 3 or spec.dedicated_controllers else 1)


def controller_set_name(cluster: str) -> str:
    """The dedicated controllers' StatefulSet (pods ``<name>-controller-N``)."""
    return child_name(cluster, "controller")


def controllers_service_name(cluster: str) -> str:
    """The dedicated controllers' headless Service: their stable names."""
    return child_name(cluster, "controllers")


def voters(cluster: str, namespace: str, controllers: int, dedicated: bool = False) -> str:
    """``KAFKA_VOTERS``: the controller voters by their stable names — nodes ``0..controllers-1`` under the brokers'
    headless Service, or the dedicated controllers (ids from :data:`CONTROLLER_ID_BASE`) under theirs."""
    if dedicated:
        suffix = f"{controllers_service_name(cluster)}.{namespace}.svc.cluster.local"
        return ",".join(f"{CONTROLLER_ID_BASE + i}={controller_set_name(cluster)}-{i}.{suffix}"
                        for i in range(controllers))  # fmt: skip
    suffix = f"{headless_name(cluster)}.{namespace}.svc.cluster.local"
    return ",".join(f"{i}={cluster}-{i}.{suffix}" for i in range(controllers))


def voter_count(env_value: str) -> int:
    """How many voters a ``KAFKA_VOTERS`` value names."""
    return len([item for item in env_value.split(",") if item.strip()])


def kraft_config_map(cluster: str, controllers: int, dedicated: bool = False) -> Obj:
    """Created once (create-once): a second write would give the nodes another id or voter list than their storage
    and metadata log hold."""
    return {"metadata": {"name": kraft_name(cluster), "labels": LABELS.labels(cluster)},
            "data": {CLUSTER_ID_KEY: new_cluster_id(), CONTROLLERS_KEY: str(controllers),
                     DEDICATED_KEY: str(dedicated).lower()}}  # fmt: skip


def config_map(cluster: str, spec: KafkaClusterSpec) -> Obj:
    """The user's broker config as a properties file (the launcher refuses owned keys again)."""
    text = "".join(f"{key}={value}\n" for key, value in sorted(spec.config.items()))
    return {"metadata": {"name": config_name(cluster), "labels": LABELS.labels(cluster)},
            "data": {"broker.properties": text}}  # fmt: skip


def config_hash(spec: KafkaClusterSpec) -> str:
    """A short hash of the broker config: brokers read it only at start, so a change must restart them."""
    text = "".join(f"{key}={value}\n" for key, value in sorted(spec.config.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _service(cluster: str, name: str, tls: bool = False, **extra: Any) -> Obj:
    ports = [{"name": "kafka", "port": CLIENT_PORT, "targetPort": CLIENT_PORT}]
    if tls:
        ports.append({"name": "kafka-tls", "port": TLS_PORT, "targetPort": TLS_PORT})
    if extra.get("clusterIP") == "None":
        ports.append({"name": "controller", "port": CONTROLLER_PORT, "targetPort": CONTROLLER_PORT})
    return {"metadata": {"name": name, "labels": LABELS.labels(cluster)},
            "spec": {"selector": LABELS.selector(cluster), "ports": ports, **extra}}  # fmt: skip


def services(cluster: str, tls: bool = False) -> list[Obj]:
    return [
        _service(cluster, headless_name(cluster), tls, clusterIP="None", publishNotReadyAddresses=True),
        _service(cluster, bootstrap_name(cluster), tls),
    ]


def _env(cluster: str, namespace: str, controllers: int, dedicated: bool = False) -> list[Obj]:
    return [
        {"name": "KAFKA_CLUSTER_ID",
         "valueFrom": {"configMapKeyRef": {"name": kraft_name(cluster), "key": CLUSTER_ID_KEY}}},
        {"name": "KAFKA_VOTERS", "value": voters(cluster, namespace, controllers, dedicated)},
        {"name": "KAFKA_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "KAFKA_DATA_DIR", "value": DATA_DIR},
        {"name": "KAFKA_CONFIG_FILE", "value": f"{CONFIG_DIR}/broker.properties"},
    ]  # fmt: skip


def _tls_env(cluster: str, namespace: str) -> list[Obj]:
    suffix = f".{headless_name(cluster)}.{namespace}.svc.cluster.local"
    return [{"name": "KAFKA_TLS_DIR", "value": TLS_DIR}, {"name": "KAFKA_TLS_PORT", "value": str(TLS_PORT)},
            {"name": "KAFKA_TLS_HOST_SUFFIX", "value": suffix}]  # fmt: skip


def _claims(cluster: str, spec: KafkaClusterSpec, size: str | None) -> list[Obj]:
    """One volume per node, labelled like the brokers' (deletionPolicy finds every volume of the cluster by them).
    ``size``: the template's size when the StatefulSet was made (a template cannot change; claims are grown
    themselves, cluster/storage.py), else the spec's."""
    request = size or spec.storage.size
    claim_spec: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": request}}}
    if spec.storage.storage_class_name:
        claim_spec["storageClassName"] = spec.storage.storage_class_name
    return [{"metadata": {"name": "data", "labels": LABELS.labels(cluster)}, "spec": claim_spec}]


#: Every Kafka container: no privilege, no capability; the pod runs as the image's kafka user with seccomp.
_CONTAINER_SECURITY: Obj = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


def _pod_spec(containers: list[Obj], volumes: list[Obj]) -> Obj:
    return {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {"runAsNonRoot": True, "runAsUser": KAFKA_UID, "runAsGroup": KAFKA_UID,
                            "fsGroup": KAFKA_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": containers,
        "volumes": volumes,
    }  # fmt: skip


def statefulset(
    cluster: str,
    namespace: str,
    spec: KafkaClusterSpec,
    controllers: int | None = None,
    tls_hash: str | None = None,
    dedicated: bool | None = None,
    claim_size: str | None = None,
) -> Obj:
    """``controllers``/``dedicated``: the voters on record (the spec's for a new cluster when None); ``tls_hash``: a
    hash of the brokers' certificate when TLS is on (a renewal is a new revision, rolled); ``claim_size``: the
    existing StatefulSet's claim template size (it cannot change)."""
    dedicated = spec.dedicated_controllers if dedicated is None else dedicated
    container: Obj = {
        "name": "kafka",
        "image": image_for(IMAGES_ENV, IMAGE, spec.version),
        "env": _env(cluster, namespace, controllers or default_controllers(spec), dedicated),
        "ports": [{"name": "kafka", "containerPort": CLIENT_PORT},
                  {"name": "controller", "containerPort": CONTROLLER_PORT}],
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR},
                         {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
        "readinessProbe": {"tcpSocket": {"port": CLIENT_PORT}, "periodSeconds": 2},
        "securityContext": _CONTAINER_SECURITY,
    }  # fmt: skip
    volumes: list[Obj] = [{"name": "config", "configMap": {"name": config_name(cluster)}}]
    annotations = {CONFIG_HASH: config_hash(spec)}
    if spec.tls.enabled:
        container["env"] += _tls_env(cluster, namespace)
        container["ports"].append({"name": "kafka-tls", "containerPort": TLS_PORT})
        container["volumeMounts"].append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        volumes.append({"name": "tls", "secret": {"secretName": tls_name(cluster), "defaultMode": 0o440}})
        annotations[TLS_HASH] = tls_hash or ""
    return {
        "metadata": {"name": cluster, "labels": LABELS.labels(cluster)},
        "spec": {
            "serviceName": headless_name(cluster),
            "replicas": spec.replicas,
            "podManagementPolicy": "Parallel",  # a quorum needs a majority of voters up before any is ready
            "selector": {"matchLabels": LABELS.selector(cluster)},
            # the config's hash in the template: a config change is a new revision, rolled by the operator
            "template": {"metadata": {"labels": LABELS.labels(cluster), "annotations": annotations},
                         "spec": _pod_spec([container], volumes)},
            # OnDelete: the StatefulSet controller never restarts a broker; the operator does, one at a time, only
            # when no partition would fall under min.insync.replicas (cluster/rolling.py)
            "updateStrategy": {"type": "OnDelete"},
            # Retain: the volumes stay when the StatefulSet goes; deletionPolicy decides (kit.carry_out)
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "volumeClaimTemplates": _claims(cluster, spec, claim_size),
        },
    }  # fmt: skip


def controllers_service(cluster: str) -> Obj:
    """Headless, every dedicated controller's stable name, ready or not (the voters find each other by it)."""
    port = {"name": "controller", "port": CONTROLLER_PORT, "targetPort": CONTROLLER_PORT}
    return {"metadata": {"name": controllers_service_name(cluster), "labels": CONTROLLER_LABELS.labels(cluster)},
            "spec": {"selector": CONTROLLER_LABELS.selector(cluster), "clusterIP": "None",
                     "publishNotReadyAddresses": True, "ports": [port]}}  # fmt: skip


def controller_statefulset(
    cluster: str, namespace: str, spec: KafkaClusterSpec, controllers: int, claim_size: str | None = None
) -> Obj:
    """The dedicated controllers: ``controllers`` voters and no broker, started together (a quorum needs a majority
    up), each with its volume (the metadata log). Rolled by the StatefulSet controller one pod at a time, each
    waiting for the last to listen again: no partition lives on them, so no min.insync.replicas gate applies."""
    env = [
        {"name": "KAFKA_CLUSTER_ID",
         "valueFrom": {"configMapKeyRef": {"name": kraft_name(cluster), "key": CLUSTER_ID_KEY}}},
        {"name": "KAFKA_VOTERS", "value": voters(cluster, namespace, controllers, dedicated=True)},
        {"name": "KAFKA_NODE_ID_BASE", "value": str(CONTROLLER_ID_BASE)},
        {"name": "KAFKA_PROCESS_ROLES", "value": "controller"},
        {"name": "KAFKA_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "KAFKA_DATA_DIR", "value": DATA_DIR},
        {"name": "KAFKA_HEAP_OPTS", "value": "-Xms32m -Xmx192m -XX:+UseSerialGC -XX:TieredStopAtLevel=1"},
    ]  # fmt: skip
    container: Obj = {
        "name": "controller",
        "image": image_for(IMAGES_ENV, IMAGE, spec.version),
        "env": env,
        "ports": [{"name": "controller", "containerPort": CONTROLLER_PORT}],
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}],
        "readinessProbe": {"tcpSocket": {"port": CONTROLLER_PORT}, "periodSeconds": 2},
        "securityContext": _CONTAINER_SECURITY,
    }
    return {
        "metadata": {"name": controller_set_name(cluster), "labels": CONTROLLER_LABELS.labels(cluster)},
        "spec": {
            "serviceName": controllers_service_name(cluster),
            "replicas": controllers,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": CONTROLLER_LABELS.selector(cluster)},
            "template": {"metadata": {"labels": CONTROLLER_LABELS.labels(cluster)},
                         "spec": _pod_spec([container], [])},
            "updateStrategy": {"type": "RollingUpdate"},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "volumeClaimTemplates": _claims(cluster, spec, claim_size),
        },
    }  # fmt: skip
