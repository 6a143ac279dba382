"""A permanent error's reason reaches the object's status even when the reconcile wrote the object first (a
finalizer added, say): the guarded status patch then meets a 409, and the object is read again, not given up."""

from __future__ import annotations

import asyncio
from typing import Any

from kanri.runtime import ApiError, Controller, PermanentError
from kanri.runtime.kinds import CONFIG_MAP

Obj = dict[str, Any]


class FakeClient:
    """The object on the server; patches guarded by a stale resourceVersion are refused as the API server would."""

    def __init__(self, stored: Obj, *, refuse: int | None = None) -> None:
        self.stored = stored
        self.refuse = refuse
        self.patches: list[Obj] = []

    async def patch_status(
        self, kind: Any, name: str, patch: Obj, namespace: str | None = None, *, field_manager: str | None = None
    ) -> Obj:
        self.patches.append(patch)
        if self.refuse is not None:
            raise ApiError(self.refuse, {"message": "refused"})
        if patch["metadata"]["resourceVersion"] != self.stored["metadata"]["resourceVersion"]:
            raise ApiError(409, {"reason": "Conflict", "message": "the object has been modified"})
        self.stored["status"] = {**(self.stored.get("status") or {}), **patch["status"]}
        return self.stored

    async def get(self, kind: Any, name: str, namespace: str | None = None) -> Obj:
        return self.stored


def obj(version: str, **extra: Any) -> Obj:
    return {"metadata": {"name": "db", "namespace": "ns", "resourceVersion": version, "generation": 1}, **extra}


def report(client: FakeClient, seen: Obj) -> None:
    async def noop(_: Any) -> None:
        return None

    controller = Controller("test", noop, for_kind=CONFIG_MAP)
    controller._client = client  # type: ignore[assignment]
    error = PermanentError("RecoveryNotSupported", "bootstrap.recovery is not implemented")
    asyncio.run(asyncio.wait_for(controller._report_permanent(seen, error), 5))


def test_a_stale_view_is_read_again_and_the_condition_written() -> None:
    client = FakeClient(obj("8"))  # the reconcile added a finalizer: version 7 -> 8
    report(client, obj("7"))
    assert len(client.patches) == 2
    (condition,) = client.stored["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == ("Ready", "False", "RecoveryNotSupported")


def test_an_already_recorded_reason_is_not_written_again() -> None:
    client = FakeClient(obj("8"))
    report(client, obj("7"))
    seen = dict(client.stored)
    client.patches.clear()
    report(client, seen)
    assert client.patches == []


def test_other_refusals_are_not_retried() -> None:
    client = FakeClient(obj("7"), refuse=422)
    report(client, obj("7"))
    assert len(client.patches) == 1
