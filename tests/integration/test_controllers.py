"""kube-controller-manager runs in the control plane: workload controllers create Pods, the garbage collector
follows ownerReferences."""

from __future__ import annotations

from kubernetes_asyncio import client as k8s

from tests.support import eventually, is_gone

LABELS = {"app": "web"}


def pod_template() -> k8s.V1PodTemplateSpec:
    return k8s.V1PodTemplateSpec(
        metadata=k8s.V1ObjectMeta(labels=LABELS),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="web", image="kanri.dev/test/web:1")]),
    )


async def test_statefulset_controller_creates_its_pods(kube_api: k8s.ApiClient, namespace: str) -> None:
    apps, core = k8s.AppsV1Api(kube_api), k8s.CoreV1Api(kube_api)
    sts = await apps.create_namespaced_stateful_set(
        namespace,
        k8s.V1StatefulSet(
            metadata=k8s.V1ObjectMeta(name="web"),
            spec=k8s.V1StatefulSetSpec(
                replicas=2,
                service_name="web",
                # Parallel: with no node to run them the Pods never become Ready, and OrderedReady would stop at web-0.
                pod_management_policy="Parallel",
                selector=k8s.V1LabelSelector(match_labels=LABELS),
                template=pod_template(),
            ),
        ),
    )

    async def both_pods() -> list[k8s.V1Pod] | None:
        pods = (await core.list_namespaced_pod(namespace, label_selector="app=web")).items
        return pods if len(pods) == 2 else None

    pods = await eventually(both_pods)
    assert sorted(p.metadata.name for p in pods) == ["web-0", "web-1"]
    for pod in pods:
        (owner,) = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid, owner.controller) == ("StatefulSet", "web", sts.metadata.uid, True)
        assert pod.spec.hostname == pod.metadata.name
        assert pod.spec.subdomain == "web"


async def test_deployment_controller_creates_a_replicaset_that_creates_pods(
    kube_api: k8s.ApiClient, namespace: str
) -> None:
    apps, core = k8s.AppsV1Api(kube_api), k8s.CoreV1Api(kube_api)
    await apps.create_namespaced_deployment(
        namespace,
        k8s.V1Deployment(
            metadata=k8s.V1ObjectMeta(name="web"),
            spec=k8s.V1DeploymentSpec(
                replicas=3, selector=k8s.V1LabelSelector(match_labels=LABELS), template=pod_template()
            ),
        ),
    )

    async def three_pods() -> list[k8s.V1Pod] | None:
        pods = (await core.list_namespaced_pod(namespace, label_selector="app=web")).items
        return pods if len(pods) == 3 else None

    pods = await eventually(three_pods)
    (replica_set,) = (await apps.list_namespaced_replica_set(namespace)).items
    assert replica_set.metadata.owner_references[0].kind == "Deployment"
    assert {p.metadata.owner_references[0].uid for p in pods} == {replica_set.metadata.uid}


async def test_job_controller_creates_a_pod(kube_api: k8s.ApiClient, namespace: str) -> None:
    batch, core = k8s.BatchV1Api(kube_api), k8s.CoreV1Api(kube_api)
    template = pod_template()
    template.spec.restart_policy = "Never"
    job = await batch.create_namespaced_job(
        namespace, k8s.V1Job(metadata=k8s.V1ObjectMeta(name="once"), spec=k8s.V1JobSpec(template=template))
    )

    async def job_pod() -> k8s.V1Pod | None:
        pods = (await core.list_namespaced_pod(namespace, label_selector=f"job-name={job.metadata.name}")).items
        return pods[0] if pods else None

    pod = await eventually(job_pod)
    assert pod.metadata.owner_references[0].uid == job.metadata.uid


async def test_garbage_collector_deletes_dependents_of_a_deleted_owner(kube_api: k8s.ApiClient, namespace: str) -> None:
    core = k8s.CoreV1Api(kube_api)
    owner = await core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="owner")))
    reference = k8s.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    await core.create_namespaced_config_map(
        namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="dependent", owner_references=[reference]))
    )
    await core.create_namespaced_secret(
        namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="dependent", owner_references=[reference]))
    )
    await core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="bystander")))

    await core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    await eventually(lambda: is_gone(lambda: core.read_namespaced_config_map("dependent", namespace)))
    await eventually(lambda: is_gone(lambda: core.read_namespaced_secret("dependent", namespace)))
    assert (await core.read_namespaced_config_map("bystander", namespace)).metadata.name == "bystander"


async def test_foreground_deletion_keeps_the_owner_until_its_dependents_are_gone(
    kube_api: k8s.ApiClient, namespace: str
) -> None:
    core = k8s.CoreV1Api(kube_api)
    owner = await core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="owner")))
    reference = k8s.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid, block_owner_deletion=True
    )
    # The dependent holds a finalizer of its own, so its deletion (and with it the owner's) waits until we drop it.
    await core.create_namespaced_config_map(
        namespace,
        k8s.V1ConfigMap(
            metadata=k8s.V1ObjectMeta(name="dependent", owner_references=[reference], finalizers=["kanri.dev/hold"])
        ),
    )

    await core.delete_namespaced_config_map("owner", namespace, propagation_policy="Foreground")

    async def dependent_deleting() -> bool:
        dependent = await core.read_namespaced_config_map("dependent", namespace)
        return dependent.metadata.deletion_timestamp is not None

    # The garbage collector deletes the dependent first, while the owner waits behind its foregroundDeletion finalizer.
    await eventually(dependent_deleting)
    deleting = await core.read_namespaced_config_map("owner", namespace)
    assert deleting.metadata.deletion_timestamp is not None
    assert "foregroundDeletion" in deleting.metadata.finalizers

    await core.patch_namespaced_config_map("dependent", namespace, {"metadata": {"finalizers": None}})
    await eventually(lambda: is_gone(lambda: core.read_namespaced_config_map("dependent", namespace)))
    await eventually(lambda: is_gone(lambda: core.read_namespaced_config_map("owner", namespace)))
