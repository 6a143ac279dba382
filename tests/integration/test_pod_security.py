"""Pod Security Admission ``restricted`` for every pod the operator makes, decided by the real API server.

In a fresh namespace labelled ``pod-security.kubernetes.io/enforce=restricted``, each pod is created with
server-side dry run (``dryRun=All``: admission runs in full, nothing is stored or scheduled): the instance pod (the
StatefulSet's template, with and without backups and recovery volumes), the restore rehearsal pod, the major upgrade's
check and upgrade pods, and the operator's own pod as the Helm chart renders it. A control pod (privileged, no
runAsNonRoot) must be refused in the same namespace, so an admission here is not a test that could not fail.
tests/e2e/test_postgres_restricted_e2e.py runs a real cluster to Ready in such a namespace as well.
"""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.rest import ApiException

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.children.rehearsal import rehearsal_pod
from kanri.postgres.children.statefulset import statefulset
from kanri.postgres.children.upgrade import check_pod, upgrade_pod
from kanri.runtime import Client
from kanri.runtime.kinds import NAMESPACE, SERVICE_ACCOUNT
from tests.helm_support import of_kind, template

Obj = dict[str, Any]
PSA = "pod-security.kubernetes.io"
RESTRICTED = {f"{PSA}/enforce": "restricted", f"{PSA}/enforce-version": "latest"}
REFUSED = 'violates PodSecurity "restricted:latest"'
UID = "0d3c5a4e-0000-4000-8000-000000000001"
S3 = {"endpoint": "https://s3.example.com", "bucket": "backups", "credentialsSecret": {"name": "s3-keys"}}
PLAIN: Obj = {"version": 16, "replicas": 2, "storage": {"size": "1Gi"}}
# every optional volume the instance pod can carry: backup credentials and the recovery source's
FULL: Obj = {**PLAIN, "backup": {"repository": {"s3": S3}},
             "bootstrap": {"recovery": {"source": "old", "repository": {"s3": S3}}},
             "podTemplate": {"labels": {"team": "a"}, "nodeSelector": {"disk": "ssd"}}}  # fmt: skip


def _cluster(namespace: str, spec: Obj) -> Obj:
    meta = {"name": "orders", "namespace": namespace, "uid": UID, "generation": 1}
    return {"apiVersion": "kanri.dev/v1alpha1", "kind": "PostgresCluster", "metadata": meta, "spec": spec}


def _bare(pod: Obj, namespace: str) -> Obj:
    """The pod without owner references (a dry run of a pod owned by a cluster that does not exist is still a pod)."""
    meta = {k: v for k, v in pod["metadata"].items() if k != "ownerReferences"}
    return {**pod, "metadata": {**meta, "namespace": namespace}}


def _instance_pod(namespace: str, spec: Obj, role: Any) -> Obj:
    # What the StatefulSet controller makes from the template: its metadata and spec, under the pod's name.
    cluster = _cluster(namespace, spec)
    sts = statefulset(cluster, PostgresClusterSpec.model_validate(spec), "orders-1", role=role,
                      image="kanri.dev/postgres:16", running=True)  # fmt: skip
    template = sts["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**template["metadata"], "name": "orders-1-0", "namespace": namespace},
            "spec": template["spec"]}  # fmt: skip


def _operator_pod(namespace: str, *values: str) -> Obj:
    (deployment,) = of_kind(template(*values, namespace=namespace), "Deployment")
    pod_template = deployment["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**pod_template["metadata"], "name": "kanri-operator-0", "namespace": namespace},
            "spec": pod_template["spec"]}  # fmt: skip


PODS = (
    "instance (primary)",
    "instance (replica, backup + recovery + podTemplate)",
    "restore rehearsal",
    "upgrade check",
    "upgrade",
    "operator (chart defaults)",
    "operator (chart, namespaced + repository + monitoring)",
)


def operator_pods(namespace: str) -> dict[str, Obj]:
    """Every pod the operator creates (or its chart runs), named for the assertion messages."""
    plain, full = _cluster(namespace, PLAIN), _cluster(namespace, FULL)
    full_spec = PostgresClusterSpec.model_validate(FULL)
    return {
        "instance (primary)": _instance_pod(namespace, PLAIN, "primary"),
        "instance (replica, backup + recovery + podTemplate)": _instance_pod(namespace, FULL, "replica"),
        "restore rehearsal": _bare(rehearsal_pod(full, 16, "first"), namespace),
        "upgrade check": _bare(check_pod(plain, 16, 17), namespace),
        "upgrade": _bare(upgrade_pod(full, full_spec, "orders-1", 16, 17), namespace),
        "operator (chart defaults)": _operator_pod(namespace),
        "operator (chart, namespaced + repository + monitoring)": _operator_pod(
            namespace, "watchNamespaces={team-a}", "backup.defaultRepository.endpoint=https://s3.example.com",
            "backup.defaultRepository.bucket=b", "backup.defaultRepository.credentialsSecret.name=k",
            "monitoring.podAnnotations=true",
        ),
    }  # fmt: skip


async def _restricted(client: Client, kube_api: k8s.ApiClient, namespace: str) -> k8s.CoreV1Api:
    await client.patch(NAMESPACE, namespace, {"metadata": {"labels": RESTRICTED}})
    # the pods' ServiceAccounts exist, so that nothing but Pod Security can refuse them
    for account in ("orders-instance", "kanri-operator"):
        await client.create(SERVICE_ACCOUNT, {"metadata": {"name": account, "namespace": namespace}})
    return k8s.CoreV1Api(kube_api)


async def _dry_run(core: k8s.CoreV1Api, namespace: str, pod: Obj) -> None:
    # kanri's Client sends no dryRun; kubernetes_asyncio does, and serialises a plain dict body as it is
    await core.create_namespaced_pod(namespace, cast("k8s.V1Pod", pod), dry_run="All")


def _message(exc: ApiException) -> str:
    """The API server's message (the body is a Status object, its quotes escaped as JSON)."""
    body = exc.body.decode() if isinstance(exc.body, bytes) else str(exc.body)
    try:
        return str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError):
        return body


async def test_the_namespace_enforces_restricted(client: Client, kube_api: k8s.ApiClient, namespace: str) -> None:
    core = await _restricted(client, kube_api, namespace)
    control = _instance_pod(namespace, PLAIN, "primary")
    pod_security = control["spec"]["securityContext"]
    del pod_security["runAsNonRoot"]
    control["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ApiException) as refused:
        await _dry_run(core, namespace, control)
    assert refused.value.status == 403
    body = _message(refused.value)
    assert REFUSED in body, body
    assert "privileged" in body, body
    assert "runAsNonRoot" in body, body


@pytest.mark.parametrize("which", PODS)
async def test_every_pod_the_operator_makes_is_admitted(
    client: Client, kube_api: k8s.ApiClient, namespace: str, which: str
) -> None:
    core = await _restricted(client, kube_api, namespace)
    pods = operator_pods(namespace)
    assert tuple(pods) == PODS
    pod = pods[which]
    try:
        await _dry_run(core, namespace, pod)
    except ApiException as exc:
        pytest.fail(f"{which}: refused ({exc.status}): {_message(exc)}")
    assert (await core.list_namespaced_pod(namespace)).items == []  # a dry run stored nothing
