"""Finalizer decisions and the guarded patches that add and remove only our own entry."""

from __future__ import annotations

from typing import Any, cast

import pytest

from kanri.runtime._client import Client
from kanri.runtime._errors import ApiError
from kanri.runtime._finalizers import (
    add_finalizer,
    add_finalizer_patch,
    finalizer_step,
    has_finalizer,
    remove_finalizer,
    remove_finalizer_patch,
)
from kanri.runtime._kinds import CONFIG_MAP

Obj = dict[str, Any]
OURS = "kanri.dev/cleanup"
THEIRS = "other.example.com/protect"


def obj(*finalizers: str, deleting: bool = False) -> Obj:
    meta: Obj = {"name": "db", "namespace": "ns", "resourceVersion": "42"}
    if finalizers:
        meta["finalizers"] = list(finalizers)
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}


@pytest.mark.parametrize(
    ("finalizers", "deleting", "step"),
    [
        ((), False, "add"),
        ((OURS,), False, "apply"),
        ((THEIRS, OURS), True, "cleanup"),
        ((THEIRS,), True, "done"),
        ((), True, "done"),
    ],
)
def test_finalizer_step_covers_the_four_cases(finalizers: tuple[str, ...], deleting: bool, step: str) -> None:
    assert finalizer_step(obj(*finalizers, deleting=deleting), OURS) == step


def test_has_finalizer() -> None:
    assert has_finalizer(obj(THEIRS, OURS), OURS)
    assert not has_finalizer(obj(THEIRS), OURS)
    assert not has_finalizer({"metadata": {}}, OURS)


def test_add_patch_is_guarded_by_resource_version_and_creates_the_list_when_missing() -> None:
    assert add_finalizer_patch(obj(), OURS) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "add", "path": "/metadata/finalizers", "value": [OURS]},
    ]


def test_add_patch_appends_to_an_existing_list() -> None:
    assert add_finalizer_patch(obj(THEIRS), OURS) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": OURS},
    ]


def test_remove_patch_tests_each_index_it_removes_from_last_to_first() -> None:
    assert remove_finalizer_patch(obj(OURS, THEIRS, OURS), OURS) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "test", "path": "/metadata/finalizers/2", "value": OURS},
        {"op": "remove", "path": "/metadata/finalizers/2"},
        {"op": "test", "path": "/metadata/finalizers/0", "value": OURS},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]


def test_no_patch_when_already_in_the_desired_state() -> None:
    assert add_finalizer_patch(obj(OURS), OURS) is None
    assert remove_finalizer_patch(obj(THEIRS), OURS) is None


def test_a_patch_needs_the_resource_version_it_is_guarded_by() -> None:
    unread = obj()
    del unread["metadata"]["resourceVersion"]
    with pytest.raises(ValueError, match="resourceVersion"):
        add_finalizer_patch(unread, OURS)


class FakeClient:
    """Records patches; answers with ``answer`` (an object, or an ApiError to raise)."""

    def __init__(self, answer: Obj | ApiError) -> None:
        self.answer = answer
        self.patches: list[tuple[str, Any, str | None, str]] = []

    async def patch(
        self, kind: object, name: str, patch: Any, namespace: str | None = None, *, patch_type: str = "merge"
    ) -> Obj:
        self.patches.append((name, patch, namespace, patch_type))
        if isinstance(self.answer, ApiError):
            raise self.answer
        return self.answer


async def test_add_and_remove_make_no_request_when_nothing_changes() -> None:
    fake = FakeClient(obj())
    client = cast(Client, fake)
    current = obj(OURS)
    assert await add_finalizer(client, CONFIG_MAP, current, OURS) is current
    assert await remove_finalizer(client, CONFIG_MAP, obj(THEIRS), OURS) == obj(THEIRS)
    assert fake.patches == []


async def test_add_sends_a_json_patch_and_returns_the_servers_object() -> None:
    updated = obj(OURS)
    fake = FakeClient(updated)
    assert await add_finalizer(cast(Client, fake), CONFIG_MAP, obj(), OURS) is updated
    assert fake.patches == [("db", add_finalizer_patch(obj(), OURS), "ns", "json")]


async def test_a_failed_test_op_is_reported_as_a_conflict() -> None:
    # What kube-apiserver answers when a JSON-patch test op fails: 422 Invalid with empty details.
    refused = ApiError(422, {"kind": "Status", "reason": "Invalid", "details": {}, "code": 422})
    with pytest.raises(ApiError) as raised:
        await remove_finalizer(cast(Client, FakeClient(refused)), CONFIG_MAP, obj(OURS), OURS)
    assert raised.value.conflict
    assert raised.value.__cause__ is refused


async def test_a_validation_error_stays_a_validation_error() -> None:
    invalid = ApiError(422, {"reason": "Invalid", "details": {"name": "db", "kind": "ConfigMap", "causes": [{}]}})
    with pytest.raises(ApiError) as raised:
        await add_finalizer(cast(Client, FakeClient(invalid)), CONFIG_MAP, obj(), "not a valid name")
    assert raised.value is invalid
