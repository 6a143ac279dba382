"""CRD generation for several versions: deprecation per version and the conversion webhook block."""

from __future__ import annotations

from kanri.runtime import KubeModel
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
