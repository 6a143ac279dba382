"""kanri.kit's status fields and deletionPolicy reading."""

from __future__ import annotations

from typing import Any

import pytest

from examples.stateful.api import KeyValueStore
from kanri.kit import deletion_policy
from kanri.runtime import crd_for


def test_a_status_model_inheriting_kitstatus_declares_every_field_the_kit_writes() -> None:
    schema = crd_for(KeyValueStore)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    status = schema["properties"]["status"]["properties"]
    assert {"observedGeneration", "conditions", "requests", "oneShotPods"} <= set(status)
    assert status["oneShotPods"]["additionalProperties"]["type"] == "string"


CASES = [({"deletionPolicy": "Delete"}, "Delete"), ({"deletionPolicy": "Retain"}, "Retain"), ({}, "Retain"),
         ({"deletionPolicy": "delete"}, "Retain")]  # fmt: skip


@pytest.mark.parametrize(("spec", "policy"), CASES)
def test_data_is_deleted_only_when_the_spec_says_delete(spec: dict[str, Any], policy: str) -> None:
    assert deletion_policy({"spec": spec}) == policy
