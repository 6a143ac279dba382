"""The instance manager's HTTP API over a fake backend: routes, bearer-token checks, error mapping."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from kanri.instance.http_api import Accepted, ActionError, build_app


class FakeBackend:
    def __init__(self) -> None:
        self.reason: str | None = "bootstrapping (replica)"
        self.token: str | None = "t0ken"
        self.promotions = 0
        self.fences: list[dict[str, Any]] = []
        self.calls: list[str] = []

    async def status(self) -> dict[str, Any]:
        return {"name": "orders-2", "role": "replica"}

    async def not_ready_reason(self) -> str | None:
        return self.reason

    async def promote(self) -> dict[str, Any]:
        self.promotions += 1
        if self.promotions > 1:
            raise ActionError(409, "this instance is already a primary")
        return {"promoted": True, "timeline": 2}

    async def restart(self) -> dict[str, Any]:
        return {"restarted": True, "pendingRestart": False}

    async def fence(self, body: dict[str, Any]) -> dict[str, Any]:
        self.fences.append(body)
        return {"fenced": True, "reason": body.get("reason")}

    async def unfence(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"fenced": False, "lifted": bool(self.fences)}

    async def pause_replication(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("pause")
        return {"paused": True, "receiveLsn": "0/5000000", "replayLsn": "0/5000000", "timeline": 1}

    async def resume_replication(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("resume")
        return {"paused": False, "resumed": True}

    async def demote(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("demote")
        return {"demoted": True, "checkpointLsn": "0/6000028", "timeline": 1}

    async def rejoin(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("rejoin")
        return Accepted({"rejoin": "started" if self.calls.count("rejoin") == 1 else "running"})

    def api_token(self) -> str | None:
        return self.token


@pytest_asyncio.fixture(loop_scope="session")
async def api() -> AsyncIterator[tuple[TestClient[Any, Any], FakeBackend]]:
    backend = FakeBackend()
    async with TestClient(TestServer(build_app(backend))) as client:
        yield client, backend


@pytest.mark.timeout(10)
async def test_readyz_is_503_with_the_reason_until_the_backend_is_ready(
    api: tuple[TestClient[Any, Any], FakeBackend],
) -> None:
    client, backend = api
    response = await client.get("/readyz")
    assert (response.status, await response.json()) == (503, {"ready": False, "reason": "bootstrapping (replica)"})
    backend.reason = None
    response = await client.get("/readyz")
    assert (response.status, await response.json()) == (200, {"ready": True})
    assert (await client.get("/healthz")).status == 200


@pytest.mark.timeout(10)
@pytest.mark.parametrize("header", [None, "Bearer wrong", "t0ken", "Basic t0ken"])
async def test_status_needs_the_bearer_token_and_the_probes_do_not(
    api: tuple[TestClient[Any, Any], FakeBackend], header: str | None
) -> None:
    client, _ = api
    headers = {} if header is None else {"Authorization": header}
    refused = await client.get("/status", headers=headers)
    assert refused.status == 401
    assert await refused.json() == {"error": "a valid bearer token is required"}, "nothing of the status leaks"
    for probe in ("/healthz", "/readyz"):
        assert (await client.get(probe, headers=headers)).status in (200, 503), f"{probe} stays open"
    answered = await client.get("/status", headers={"Authorization": "Bearer t0ken"})
    assert await answered.json() == {"name": "orders-2", "role": "replica"}


@pytest.mark.timeout(10)
@pytest.mark.parametrize("header", [None, "Bearer wrong", "t0ken", "Basic t0ken"])
async def test_actions_without_the_bearer_token_are_401(
    api: tuple[TestClient[Any, Any], FakeBackend], header: str | None
) -> None:
    client, backend = api
    headers = {} if header is None else {"Authorization": header}
    for path in (*ACTIONS, "/promote", "/restart", "/fence", "/unfence"):
        response = await client.post(path, headers=headers)
        assert response.status == 401
        assert "error" in await response.json()
    assert backend.promotions == 0
    assert backend.fences == []
    assert backend.calls == []


ACTIONS = ("/replication/pause", "/replication/resume", "/demote", "/rejoin")


@pytest.mark.timeout(10)
async def test_the_high_availability_actions_answer_json_and_rejoin_answers_202(
    api: tuple[TestClient[Any, Any], FakeBackend],
) -> None:
    client, backend = api
    auth = {"Authorization": "Bearer t0ken"}
    answers = []
    for path in (*ACTIONS, "/rejoin"):
        response = await client.post(path, headers=auth, json={})
        answers.append((response.status, await response.json()))
    assert answers == [
        (200, {"paused": True, "receiveLsn": "0/5000000", "replayLsn": "0/5000000", "timeline": 1}),
        (200, {"paused": False, "resumed": True}),
        (200, {"demoted": True, "checkpointLsn": "0/6000028", "timeline": 1}),
        (202, {"rejoin": "started"}),
        (202, {"rejoin": "running"}),
    ]
    assert backend.calls == ["pause", "resume", "demote", "rejoin", "rejoin"]


@pytest.mark.timeout(10)
async def test_no_token_file_refuses_every_action(api: tuple[TestClient[Any, Any], FakeBackend]) -> None:
    client, backend = api
    backend.token = None
    assert (await client.post("/restart", headers={"Authorization": "Bearer "})).status == 401


@pytest.mark.timeout(10)
async def test_an_action_error_becomes_its_status_with_a_json_reason(
    api: tuple[TestClient[Any, Any], FakeBackend],
) -> None:
    client, _ = api
    auth = {"Authorization": "Bearer t0ken"}
    first = await client.post("/promote", headers=auth)
    assert (first.status, await first.json()) == (200, {"promoted": True, "timeline": 2})
    second = await client.post("/promote", headers=auth)
    assert (second.status, await second.json()) == (409, {"error": "this instance is already a primary"})
    restart = await client.post("/restart", headers=auth)
    assert (restart.status, await restart.json()) == (200, {"restarted": True, "pendingRestart": False})


@pytest.mark.timeout(10)
async def test_fence_passes_its_json_body_and_refuses_anything_but_an_object(
    api: tuple[TestClient[Any, Any], FakeBackend],
) -> None:
    client, backend = api
    auth = {"Authorization": "Bearer t0ken"}
    fenced = await client.post("/fence", headers=auth, json={"reason": "split brain"})
    assert (fenced.status, await fenced.json()) == (200, {"fenced": True, "reason": "split brain"})
    assert (await client.post("/fence", headers=auth)).status == 200  # no body: {}
    assert backend.fences == [{"reason": "split brain"}, {}]
    for bad in (b"[1]", b"not json", b'"text"'):
        response = await client.post("/fence", headers=auth, data=bad)
        assert (response.status, await response.json()) == (400, {"error": "the body must be a JSON object"})
    too_big = await client.post("/fence", headers=auth, json={"reason": "x" * 5000})
    assert too_big.status == 413
    assert len(backend.fences) == 2
    lifted = await client.post("/unfence", headers=auth)
    assert (lifted.status, await lifted.json()) == (200, {"fenced": False, "lifted": True})
