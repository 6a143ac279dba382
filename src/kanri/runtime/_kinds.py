"""Resource kinds and their REST paths. Objects stay raw JSON dicts; a Kind says where they live."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kind:
    """A Kubernetes resource type: ``Kind("apps/v1", "StatefulSet", "statefulsets")``."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """The REST path: collection when ``name`` is None, all namespaces when ``namespace`` is None."""
        root = f"/apis/{self.api_version}" if self.group else f"/api/{self.version}"
        parts = [root]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name is not None:
            parts.append(name)
            if subresource:
                parts.append(subresource)
        return "/".join(parts)

    def __str__(self) -> str:
        return f"{self.kind}.{self.api_version}"


def namespace_of(obj: Mapping[str, Any]) -> str:
    """The object's namespace ("" for cluster-scoped objects)."""
    return str(obj.get("metadata", {}).get("namespace") or "")


def name_of(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["name"])


# Built-in kinds operators commonly touch. Others: construct a Kind, or Client.discover().
NAMESPACE = Kind("v1", "Namespace", "namespaces", namespaced=False)
NODE = Kind("v1", "Node", "nodes", namespaced=False)
PERSISTENT_VOLUME = Kind("v1", "PersistentVolume", "persistentvolumes", namespaced=False)
STORAGE_CLASS = Kind("storage.k8s.io/v1", "StorageClass", "storageclasses", namespaced=False)
CONFIG_MAP = Kind("v1", "ConfigMap", "configmaps")
SECRET = Kind("v1", "Secret", "secrets")
SERVICE = Kind("v1", "Service", "services")
ENDPOINT_SLICE = Kind("discovery.k8s.io/v1", "EndpointSlice", "endpointslices")
SERVICE_ACCOUNT = Kind("v1", "ServiceAccount", "serviceaccounts")
POD = Kind("v1", "Pod", "pods")
PVC = Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
EVENT = Kind("v1", "Event", "events")
STATEFUL_SET = Kind("apps/v1", "StatefulSet", "statefulsets")
DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
DAEMON_SET = Kind("apps/v1", "DaemonSet", "daemonsets")
REPLICA_SET = Kind("apps/v1", "ReplicaSet", "replicasets")
JOB = Kind("batch/v1", "Job", "jobs")
CRON_JOB = Kind("batch/v1", "CronJob", "cronjobs")
ENDPOINTS = Kind("v1", "Endpoints", "endpoints")
LIMIT_RANGE = Kind("v1", "LimitRange", "limitranges")
RESOURCE_QUOTA = Kind("v1", "ResourceQuota", "resourcequotas")
INGRESS = Kind("networking.k8s.io/v1", "Ingress", "ingresses")
INGRESS_CLASS = Kind("networking.k8s.io/v1", "IngressClass", "ingressclasses", namespaced=False)
NETWORK_POLICY = Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies")
HORIZONTAL_POD_AUTOSCALER = Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers")
PRIORITY_CLASS = Kind("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", namespaced=False)
VOLUME_ATTACHMENT = Kind("storage.k8s.io/v1", "VolumeAttachment", "volumeattachments", namespaced=False)
CSI_DRIVER = Kind("storage.k8s.io/v1", "CSIDriver", "csidrivers", namespaced=False)
VALIDATING_WEBHOOK_CONFIGURATION = Kind(
    "admissionregistration.k8s.io/v1",
    "ValidatingWebhookConfiguration",
    "validatingwebhookconfigurations",
    namespaced=False,
)
MUTATING_WEBHOOK_CONFIGURATION = Kind(
    "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "mutatingwebhookconfigurations", namespaced=False
)
LEASE = Kind("coordination.k8s.io/v1", "Lease", "leases")
ROLE = Kind("rbac.authorization.k8s.io/v1", "Role", "roles")
ROLE_BINDING = Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
CLUSTER_ROLE = Kind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", namespaced=False)
CLUSTER_ROLE_BINDING = Kind(
    "rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", namespaced=False
)
POD_DISRUPTION_BUDGET = Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
CRD = Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", namespaced=False)
TOKEN_REVIEW = Kind("authentication.k8s.io/v1", "TokenReview", "tokenreviews", namespaced=False)
SUBJECT_ACCESS_REVIEW = Kind("authorization.k8s.io/v1", "SubjectAccessReview", "subjectaccessreviews", namespaced=False)
