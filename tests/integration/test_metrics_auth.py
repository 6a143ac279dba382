"""The Manager's /metrics behind the real API server's TokenReview and SubjectAccessReview (issue 33): no token 401,
a token the server does not know 401, a ServiceAccount without the grant 403, the same one once a ClusterRole grants
``get`` on /metrics 200; /healthz and /readyz stay open for the kubelet. Without ``metrics_auth`` /metrics is open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from kanri.runtime import ApiError, Client, Controller, Manager, ManagerOptions, Request, Result
from kanri.runtime.kinds import CLUSTER_ROLE, CLUSTER_ROLE_BINDING, CONFIG_MAP, SERVICE_ACCOUNT
from tests.support import eventually


class Idle:
    """A reconciler that does nothing: a manager runs only while it has a controller."""

    async def reconcile(self, request: Request) -> Result | None:
        return None


def serving(client: Client, options: ManagerOptions) -> Manager:
    manager = Manager(client, options)
    manager.add(Controller("idle", Idle(), for_kind=CONFIG_MAP))
    return manager


@pytest_asyncio.fixture(loop_scope="session")
async def running(client: Client, namespace: str) -> AsyncIterator[str]:
    """A manager (no controllers) serving its health port with metrics_auth on; yields its base URL."""
    options = ManagerOptions(name="metrics-auth", namespace=namespace, leader_election=False, health_port=0,
                             metrics_auth=True)  # fmt: skip
    manager = serving(client, options)
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        await eventually(lambda: asyncio.sleep(0, manager.health_port is not None), timeout=10)
        yield f"http://127.0.0.1:{manager.health_port}"
    finally:
        await manager.stop()
        await task


async def get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as response:
        return response.status, await response.text()


async def service_account_token(client: Client, namespace: str, name: str) -> str:
    await client.create(SERVICE_ACCOUNT, {"metadata": {"name": name, "namespace": namespace}})
    return await new_token(client, namespace, name)


async def new_token(client: Client, namespace: str, name: str) -> str:
    """A fresh token of the ServiceAccount ``name`` (each TokenRequest answers a different one)."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
    answer = await client.create_subresource(SERVICE_ACCOUNT, name, "token", request, namespace)
    return str(answer["status"]["token"])


async def test_metrics_need_a_token_the_api_server_allows_and_health_stays_open(
    client: Client, namespace: str, running: str
) -> None:
    assert (await get(f"{running}/healthz"))[0] == 200
    status, body = await get(f"{running}/metrics")
    assert status == 401, body
    status, body = await get(f"{running}/metrics", "not-a-token")
    assert status == 401, body

    token = await service_account_token(client, namespace, "scraper")
    user = f"system:serviceaccount:{namespace}:scraper"
    status, body = await get(f"{running}/metrics", token)
    assert status == 403, body
    assert f"{user} may not get /metrics" in body, body
    assert "# HELP" not in body, body

    role = f"metrics-reader-{namespace}"
    await client.create(CLUSTER_ROLE, {"metadata": {"name": role},
                                       "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})  # fmt: skip
    await client.create(CLUSTER_ROLE_BINDING, {
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}],
    })  # fmt: skip
    try:
        # The refusal of the first token is remembered for 30 s (the TTL is the unit tests' business): a new token of
        # the same ServiceAccount is reviewed afresh, so only the grant reaching the API server is waited for.
        granted = await new_token(client, namespace, "scraper")
        last: list[tuple[int, str]] = []

        async def served() -> bool:
            last[:] = [await get(f"{running}/metrics", granted)]
            return last[0][0] == 200

        try:
            await eventually(served, timeout=60)
        except TimeoutError:
            pytest.fail(f"the granted ServiceAccount was not served /metrics within 60 s; last answer: {last}")
        assert "# HELP" in last[0][1], last[0][1][:300]
    finally:
        for kind in (CLUSTER_ROLE_BINDING, CLUSTER_ROLE):
            try:
                await client.delete(kind, role)
            except ApiError as exc:
                if exc.status != 404:
                    raise
    assert (await get(f"{running}/readyz"))[0] in (200, 503), "readyz answers without a token"


async def test_without_metrics_auth_metrics_are_open(client: Client, namespace: str) -> None:
    manager = serving(client, ManagerOptions(name="open", namespace=namespace, leader_election=False, health_port=0))
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        await eventually(lambda: asyncio.sleep(0, manager.health_port is not None), timeout=10)
        assert (await get(f"http://127.0.0.1:{manager.health_port}/metrics"))[0] == 200
    finally:
        await manager.stop()
        await task
