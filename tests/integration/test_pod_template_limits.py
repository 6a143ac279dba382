"""podTemplate's limits on the real API server (issue 33): no system- PriorityClass, no annotation that changes the
pod's security profile — each refused with a message naming what was refused — while ordinary classes and
annotations still pass."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from tests.integration.test_postgrescluster_api import BASE, Clusters, cluster, installed, merged, refusal

__all__ = ["installed"]  # the session fixture, imported so pytest finds it here too


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("priority", ["system-node-critical", "system-cluster-critical", "system-anything"])
async def test_a_system_priority_class_is_refused(kube_api: k8s.ApiClient, namespace: str, priority: str) -> None:
    spec = merged(BASE, {"podTemplate": {"priorityClassName": priority}})
    message = await refusal(Clusters(kube_api, namespace).create(cluster("pc", spec)))
    assert "spec.podTemplate.priorityClassName" in message, message
    assert f'priorityClassName "{priority}" is reserved for the components of the cluster itself' in message, message


SECURITY_KEYS: list[tuple[str, str]] = [
    ("container.apparmor.security.beta.kubernetes.io/postgres", "unconfined"),
    ("seccomp.security.alpha.kubernetes.io/pod", "unconfined"),
    ("container.seccomp.security.alpha.kubernetes.io/postgres", "unconfined"),
    ("security.alpha.kubernetes.io/unsafe-sysctls", "kernel.msgmax=65536"),
    ("io.kubernetes.cri-o.Devices", "/dev/fuse"),
]


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(("key", "value"), SECURITY_KEYS, ids=[key for key, _ in SECURITY_KEYS])
async def test_an_annotation_that_changes_the_security_profile_is_refused(
    kube_api: k8s.ApiClient, namespace: str, key: str, value: str
) -> None:
    annotations = {key: value, "example.com/owner": "team-a"}
    spec = merged(BASE, {"podTemplate": {"annotations": annotations}})
    message = await refusal(Clusters(kube_api, namespace).create(cluster("sec", spec)))
    assert "spec.podTemplate.annotations" in message, message
    assert f'belong to the operator: ["{key}"]' in message, message  # only the offending key is named


@pytest.mark.usefixtures("installed")
async def test_an_update_adding_a_security_annotation_is_refused(kube_api: k8s.ApiClient, namespace: str) -> None:
    clusters = Clusters(kube_api, namespace)
    await clusters.create(cluster("later", BASE))
    patch = {
        "spec": {"podTemplate": {"annotations": {"container.apparmor.security.beta.kubernetes.io/x": "unconfined"}}}
    }
    message = await refusal(clusters.patch("later", patch))
    assert "AppArmor" in message, message
    assert "podTemplate" not in (await clusters.get("later"))["spec"], "nothing was stored"


@pytest.mark.usefixtures("installed")
async def test_ordinary_priority_classes_and_annotations_are_accepted(kube_api: k8s.ApiClient, namespace: str) -> None:
    template: dict[str, Any] = {
        "priorityClassName": "tenant-high",
        "annotations": {
            "example.com/security-team": "reviewed",  # a key that only mentions security is fine
            "prometheus.io/scrape": "true",
        },
    }
    created = await Clusters(kube_api, namespace).create(cluster("ok", merged(BASE, {"podTemplate": template})))
    assert created["spec"]["podTemplate"] == template
