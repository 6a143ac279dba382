"""The chart's conversion webhook (values conversionWebhook): off by default; on, a Service on 9443 in front of every
operator replica, the env that makes the operator serve behind it, and exactly the rights
kanri.postgres.operator.CONVERSION names, in both modes."""

from __future__ import annotations

import pytest

from kanri.postgres.operator import CONVERSION
from kanri.postgres.versions import (
    STORAGE_VERSION_ENV,
    WEBHOOK_SERVICE_ENV,
    versions_from_environment,
    webhook_from_environment,
)
from kanri.runtime import crd_for
from tests.helm_support import CHART, Obj, as_grants, helm, of_kind, rule_grants, template

ON = "conversionWebhook.enabled=true"


def _webhook_objects(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if "webhook" in o["metadata"]["name"] or "conversion" in o["metadata"]["name"]]


def _container(objects: list[Obj]) -> Obj:
    (deployment,) = of_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_off_by_default() -> None:
    objects = template()
    assert _webhook_objects(objects) == []
    assert WEBHOOK_SERVICE_ENV not in {e["name"] for e in _container(objects)["env"]}
    assert of_kind(template("replicaCount=2"), "PodDisruptionBudget") == []


@pytest.mark.parametrize("mode", [(), ("watchNamespaces={team-a}",)], ids=["cluster-wide", "namespaced"])
def test_on_the_operator_serves_behind_a_service_on_9443_with_exactly_the_conversion_rights(
    mode: tuple[str, ...],
) -> None:
    objects = template(ON, *mode)
    (deployment,) = of_kind(objects, "Deployment")
    container = _container(objects)
    env = {e["name"]: e for e in container["env"]}
    (service,) = [s for s in of_kind(objects, "Service") if s["metadata"]["name"] == "kanri-operator-webhook"]
    assert env[WEBHOOK_SERVICE_ENV]["value"] == service["metadata"]["name"]
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    options = webhook_from_environment({WEBHOOK_SERVICE_ENV: env[WEBHOOK_SERVICE_ENV]["value"],
                                        "POD_NAMESPACE": "kanri-system"})  # fmt: skip
    assert options is not None
    assert service["metadata"]["namespace"] == options.namespace
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    # ... and only pods serving it: during the upgrade from a release without the webhook, its pods get none of it
    assert service["spec"]["selector"] != deployment["spec"]["selector"]["matchLabels"]
    (default_deployment,) = of_kind(template(*mode), "Deployment")
    assert not set(service["spec"]["selector"].items()) <= set(
        default_deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert service["spec"]["publishNotReadyAddresses"] is True  # a replica is ready only once it converted
    (port,) = service["spec"]["ports"]
    assert port["port"] == options.port == 9443
    assert {"name": port["targetPort"], "containerPort": 9443} in container["ports"]
    (policy,) = of_kind(objects, "NetworkPolicy")
    assert {"ports": [{"protocol": "TCP", "port": 9443}]} in policy["spec"]["ingress"]
    # the rights: the Secret (named, in the release namespace), the CRDs (named), every object of the two kinds
    (secret_role,) = [r for r in of_kind(objects, "Role") if r["metadata"]["name"] == "kanri-operator-webhook"]
    assert secret_role["metadata"]["namespace"] == "kanri-system"
    named = [rule for rule in secret_role["rules"] if rule.get("resourceNames")]
    assert named == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [options.secret],
                      "verbs": ["get", "update"]}]  # fmt: skip
    (conversion_role,) = [r for r in of_kind(objects, "ClusterRole") if r["metadata"]["name"].endswith("-conversion")]
    granted = rule_grants(secret_role["rules"]) | rule_grants(conversion_role["rules"])
    events = [r for r in of_kind(objects, "Role") if r["metadata"]["name"].endswith("-conversion-events")]
    if mode:  # namespaced: the CRD's Event lands in default, which no watched-namespace Role covers
        (events_role,) = events
        assert events_role["metadata"]["namespace"] == "default"
        granted |= rule_grants(events_role["rules"])
    else:
        assert events == []
        (main,) = [r for r in of_kind(objects, "ClusterRole") if r["metadata"]["name"] == "kanri-operator"]
        granted |= {g for g in rule_grants(main["rules"]) if g[1] == "events"}
    needed = as_grants({(p.kind, p.subresource): p.verbs for p in CONVERSION})
    assert needed <= granted, f"not granted: {needed - granted}"
    crd_rules = [rule for rule in conversion_role["rules"] if rule["apiGroups"] == ["apiextensions.k8s.io"]]
    names = ["postgresclusters.kanri.dev", "postgresbackups.kanri.dev", "postgrespoolers.kanri.dev"]
    assert all(rule["resourceNames"] == names for rule in crd_rules)
    for binding in [*of_kind(objects, "RoleBinding"), *of_kind(objects, "ClusterRoleBinding")]:
        if binding["roleRef"]["name"] in {"kanri-operator-webhook", "kanri-operator-conversion"}:
            assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kanri-operator",
                                            "namespace": "kanri-system"}]  # fmt: skip


def test_two_replicas_keep_one_through_a_drain() -> None:
    (budget,) = of_kind(template(ON, "replicaCount=2"), "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert of_kind(template(ON), "PodDisruptionBudget") == []  # one replica: a budget would block every drain


def test_the_webhook_needs_the_operator_to_bring_its_crds() -> None:
    result = helm("template", "kanri", str(CHART), "--set", ON, "--set", "upgradeCRDs=false", check=False)
    assert result.returncode != 0
    assert "conversionWebhook.enabled needs upgradeCRDs" in result.stderr


@pytest.mark.parametrize("stored", ["v1alpha1", "v1beta1"])
def test_the_storage_version_reaches_the_operator_and_selects_its_versions(stored: str) -> None:
    values = (ON,) if stored == "v1alpha1" else (ON, f"conversionWebhook.storageVersion={stored}")
    env = {e["name"]: e.get("value") for e in _container(template(*values))["env"]}
    assert env[STORAGE_VERSION_ENV] == stored  # the default is named, not left to the operator's own default
    versions = versions_from_environment({STORAGE_VERSION_ENV: env[STORAGE_VERSION_ENV]})
    stored_by_crd = [[v["name"] for v in crd_for(*c.resources)["spec"]["versions"] if v["storage"]] for c in versions]
    assert stored_by_crd == [[stored], [stored], [stored]]  # clusters, backups, poolers


def test_the_storage_version_is_only_set_with_the_webhook_and_only_to_a_version_the_crds_have() -> None:
    assert STORAGE_VERSION_ENV not in {e["name"] for e in _container(template())["env"]}
    result = helm("template", "kanri", str(CHART), "--set", ON, "--set", "conversionWebhook.storageVersion=v1",
                  check=False)  # fmt: skip
    assert result.returncode != 0
    assert 'conversionWebhook.storageVersion "v1": the storage version must be v1alpha1 or v1beta1' in result.stderr
