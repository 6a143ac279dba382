"""CRD generation for several versions: deprecation per version and the conversion webhook block."""

from __future__ import annotations

from typing import Any

from kanri.runtime import KubeModel
from kanri.runtime._conversion_webhook import conversion_patch
from kanri.runtime._crd import CustomResource, crd_for

GROUP = "conv.kanri.dev"


class Spec(KubeModel):
    name: str


class ThingV2(CustomResource, group=GROUP, version="v2", kind="Thing", plural="things"):
    spec: Spec


class ThingV1(CustomResource, group=GROUP, version="v1", kind="Thing", plural="things", storage=False,
              deprecation_warning="conv.kanri.dev/v1 Thing is deprecated; use v2"):  # fmt: skip
    spec: Spec


def test_a_deprecation_warning_marks_the_version_deprecated() -> None:
    crd = crd_for(ThingV2, ThingV1)
    v2, v1 = crd["spec"]["versions"]
    assert (v1["deprecated"], v1["deprecationWarning"]) == (True, "conv.kanri.dev/v1 Thing is deprecated; use v2")
    assert "deprecated" not in v2
    assert "deprecationWarning" not in v2
    assert (v2["storage"], v1["storage"]) == (True, False)
    assert "conversion" not in crd["spec"]


def test_a_webhook_client_config_makes_the_strategy_webhook_with_review_version_v1() -> None:
    service = {"service": {"name": "op", "namespace": "ops", "path": "/convert", "port": 9443}}
    crd = crd_for(ThingV2, ThingV1, webhook=service)
    assert crd["spec"]["conversion"] == {
        "strategy": "Webhook",
        "webhook": {"clientConfig": service, "conversionReviewVersions": ["v1"]},
    }


def _crd(served: list[str], conversion: dict[str, Any] | None = None) -> dict[str, Any]:
    versions = [{"name": name, "served": True, "storage": index == 0} for index, name in enumerate(served)]
    return {"spec": {"versions": versions, "conversion": conversion or {"strategy": "None"}}}


def test_the_webhook_points_a_two_version_crd_at_itself_and_drops_the_other_address_form() -> None:
    client_config = {"service": {"name": "w", "namespace": "ns", "path": "/convert", "port": 9443}, "caBundle": "Q0E="}
    patch = conversion_patch(_crd(["v1", "v1alpha1"]), client_config)
    assert patch == {"spec": {"conversion": {"strategy": "Webhook", "webhook": {
        "clientConfig": {**client_config, "url": None}, "conversionReviewVersions": ["v1"]}}}}  # fmt: skip
    pointed = {"strategy": "Webhook", "webhook": {"clientConfig": client_config, "conversionReviewVersions": ["v1"]}}
    assert conversion_patch(_crd(["v1", "v1alpha1"], pointed), client_config) is None
    rotated = {**client_config, "caBundle": "TkVX"}
    assert conversion_patch(_crd(["v1", "v1alpha1"], pointed), rotated) is not None


def test_a_crd_taken_back_to_one_version_is_left_alone() -> None:
    # an operator without the webhook replaced the CRD: a replica still running with it must not turn it back on
    assert conversion_patch(_crd(["v1alpha1"]), {"url": "https://127.0.0.1:9443/convert", "caBundle": "Q0E="}) is None
    one_served = _crd(["v1", "v1alpha1"])
    one_served["spec"]["versions"][1]["served"] = False
    assert conversion_patch(one_served, {"url": "https://127.0.0.1:9443/convert", "caBundle": "Q0E="}) is None
