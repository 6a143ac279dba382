"""A CustomResourceDefinition with a structural schema, a status subresource and a CEL transition rule."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support import eventually, is_gone, status_message

GROUP = "test.kanri.dev"
VERSION = "v1"


def volume_crd(plural: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["size"],
                                    "properties": {
                                        "size": {
                                            "type": "string",
                                            "x-kubernetes-validations": [
                                                {"rule": "isQuantity(self)", "message": "size must be a quantity"},
                                                {
                                                    "rule": "!isQuantity(self) || !isQuantity(oldSelf) || "
                                                    "quantity(self).compareTo(quantity(oldSelf)) >= 0",
                                                    "messageExpression": "'size may not shrink (from ' + oldSelf"
                                                    " + ' to ' + self + ')'",
                                                    "reason": "FieldValueForbidden",
                                                },
                                            ],
                                        },
                                    },
                                },
                                "status": {
                                    "type": "object",
                                    "properties": {"phase": {"type": "string"}},
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


@pytest_asyncio.fixture(loop_scope="session")
async def volume_plural(kube_api: k8s.ApiClient) -> AsyncIterator[str]:
    """Install a fresh CRD (unique name per test) and wait until it is Established."""
    suffix = secrets.token_hex(3)
    plural, kind = f"volumes{suffix}", f"Volume{suffix}"
    ext = k8s.ApiextensionsV1Api(kube_api)
    # The client sends a plain dict unchanged; the typed signature only lists its generated model.
    await ext.create_custom_resource_definition(volume_crd(plural, kind))  # type: ignore[arg-type]
    name = f"{plural}.{GROUP}"

    async def established() -> bool:
        crd = await ext.read_custom_resource_definition(name)
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    await eventually(established, timeout=30)
    try:
        yield plural
    finally:
        await ext.delete_custom_resource_definition(name)
        await eventually(lambda: is_gone(lambda: ext.read_custom_resource_definition(name)), timeout=60)


MERGE_PATCH = "application/merge-patch+json"


async def merge_patch(
    custom: k8s.CustomObjectsApi, namespace: str, plural: str, name: str, body: dict[str, Any], *, status: bool = False
) -> dict[str, Any]:
    """A merge patch (the client would send a dict as a JSON patch; `_content_type` is missing from its stubs)."""
    patch = custom.patch_namespaced_custom_object_status if status else custom.patch_namespaced_custom_object
    result: dict[str, Any] = await patch(
        GROUP,
        VERSION,
        namespace,
        plural,
        name,
        body,
        _content_type=MERGE_PATCH,  # type: ignore[call-arg]
    )
    return result


def volume(name: str, size: str, kind: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, "spec": {"size": size}}


async def test_cel_transition_rule_refuses_to_shrink_a_quantity(
    kube_api: k8s.ApiClient, namespace: str, volume_plural: str
) -> None:
    custom = k8s.CustomObjectsApi(kube_api)
    kind = "Volume" + volume_plural.removeprefix("volumes")
    await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, volume_plural, volume("data", "10Gi", kind))

    # Growing is allowed, including across units (10Gi -> 20000Mi is a growth).
    grown = await merge_patch(custom, namespace, volume_plural, "data", {"spec": {"size": "20000Mi"}})
    assert grown["spec"]["size"] == "20000Mi"

    with pytest.raises(ApiException) as refused:
        await merge_patch(custom, namespace, volume_plural, "data", {"spec": {"size": "19Gi"}})
    assert refused.value.status == 422
    message = status_message(refused.value)
    assert "spec.size" in message
    assert "size may not shrink (from 20000Mi to 19Gi)" in message

    stored = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, volume_plural, "data")
    assert stored["spec"]["size"] == "20000Mi"


async def test_structural_schema_rejects_wrong_types_and_missing_fields(
    kube_api: k8s.ApiClient, namespace: str, volume_plural: str
) -> None:
    custom = k8s.CustomObjectsApi(kube_api)
    kind = "Volume" + volume_plural.removeprefix("volumes")

    not_a_quantity = volume("a", "lots", kind)
    with pytest.raises(ApiException) as bad_quantity:
        await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, volume_plural, not_a_quantity)
    assert bad_quantity.value.status == 422
    assert "size must be a quantity" in status_message(bad_quantity.value)

    missing = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": "b"}, "spec": {}}
    with pytest.raises(ApiException) as no_size:
        await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, volume_plural, missing)
    assert no_size.value.status == 422
    assert "spec.size: Required value" in status_message(no_size.value)

    # Unknown fields are pruned, not stored: that is what a structural schema buys.
    extra = volume("c", "1Gi", kind)
    extra["spec"]["unknownField"] = "dropped"
    created = await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, volume_plural, extra)
    assert "unknownField" not in created["spec"]


async def test_status_subresource_separates_spec_and_status_writes(
    kube_api: k8s.ApiClient, namespace: str, volume_plural: str
) -> None:
    custom = k8s.CustomObjectsApi(kube_api)
    kind = "Volume" + volume_plural.removeprefix("volumes")
    created = await custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, volume_plural, {**volume("d", "1Gi", kind), "status": {"phase": "Ignored"}}
    )
    assert "status" not in created, "status on create is dropped when the status subresource is enabled"
    generation = created["metadata"]["generation"]

    after_status = await merge_patch(
        custom, namespace, volume_plural, "d", {"status": {"phase": "Ready"}, "spec": {"size": "5Gi"}}, status=True
    )
    assert after_status["status"] == {"phase": "Ready"}
    assert after_status["spec"]["size"] == "1Gi", "the /status endpoint ignores spec"
    assert after_status["metadata"]["generation"] == generation, "status writes do not bump generation"

    after_spec = await merge_patch(
        custom, namespace, volume_plural, "d", {"spec": {"size": "2Gi"}, "status": {"phase": "Hacked"}}
    )
    assert after_spec["status"] == {"phase": "Ready"}, "the main endpoint ignores status"
    assert after_spec["metadata"]["generation"] == generation + 1
