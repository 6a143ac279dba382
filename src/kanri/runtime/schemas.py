"""Kubernetes' own types to embed in a custom resource's model, with the schema the pinned Kubernetes version serves.

Each name is ``dict[str, Any]`` in Python (passed on to the child unchanged) whose CRD schema is generated from the
API server's OpenAPI (``kanri/runtime/k8s_openapi.json``, checked against the server by a test)::

    from kanri.runtime.schemas import JobTemplateSpec, ObjectReference

    class BackupSpec(KubeModel):
        job_template: JobTemplateSpec
        \"\"\"The Job each backup runs.\"\"\"
        target: ObjectReference | None = None

Any other stored definition: ``Annotated[dict[str, Any], k8s_schema("io.k8s.api.core.v1.Probe")]``.
"""

from typing import Annotated, Any

from kanri.runtime._k8s_schemas import K8sSchema, K8sSchemaError, k8s_schema, kubernetes_version

__all__ = [
    "Affinity",
    "Container",
    "EnvVar",
    "JobSpec",
    "JobTemplateSpec",
    "K8sSchema",
    "K8sSchemaError",
    "LabelSelector",
    "LocalObjectReference",
    "ObjectReference",
    "PersistentVolumeClaimSpec",
    "PodSpec",
    "PodTemplateSpec",
    "ResourceRequirements",
    "Toleration",
    "Volume",
    "k8s_schema",
    "kubernetes_version",
]

PodTemplateSpec = Annotated[dict[str, Any], K8sSchema("io.k8s.api.core.v1.PodTemplateSpec")]
PodSpec = Annotated[dict[str, Any], K8sSchema("io.k8s.api.core.v1.PodSpec")]
JobTemplateSpec = Annotated[dict[str, Any], K8sSchema("io.k8s.api.batch.v1.JobTemplateSpec")]
JobSpec = Annotated[dict[str, Any], K8sSchema("io.k8s.api.batch.v1.JobSpec")]
ObjectReference = Annotated[dict[str, Any], K8sSchema("io.k8s.api.core.v1.ObjectReference")]
LocalObjectReference = Annotated[dict[str, Any], K8sSchema("io.k8s.api.core.v1.LocalObjectReference")]
Container = Annotated[dict[str, Any], K8sSchema("io.k8s.api.core.v1.Container")]
EnvVar = Annotated[dict[str, Any], K8sSchema("io.k8s.api.core.v1.EnvVar")]
Volume = Annotated[dict[str, Any], K8sSchema("io.k8s.api.core.v1.Volume")]
ResourceRequirements = Annotated[dict[str, Any], K8sSchema("io.k8s.api.core.v1.ResourceRequirements")]
Affinity = Annotated[dict[str, Any], K8sSchema("io.k8s.api.core.v1.Affinity")]
Toleration = Annotated[dict[str, Any], K8sSchema("io.k8s.api.core.v1.Toleration")]
LabelSelector = Annotated[dict[str, Any], K8sSchema("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector")]
PersistentVolumeClaimSpec = Annotated[dict[str, Any], K8sSchema("io.k8s.api.core.v1.PersistentVolumeClaimSpec")]
