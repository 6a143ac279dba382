"""A manager watching a list of namespaces, on the real API server: objects of the listed namespaces are cached and
reconciled, objects of any other namespace are neither; a deletion in one namespace's stream does not touch the
others' objects; and a write into an unwatched namespace does not make the controller wait for an event that never
comes."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest_asyncio

from kanri.runtime import ApiError, Client, Controller, Manager, ManagerOptions, Request
from kanri.runtime.kinds import CONFIG_MAP, NAMESPACE
from tests.support import eventually


@pytest_asyncio.fixture(loop_scope="session")
async def three_namespaces(client: Client) -> AsyncIterator[list[str]]:
    names = [f"watch-{part}-{secrets.token_hex(3)}" for part in ("a", "b", "c")]
    for name in names:
        await client.create(NAMESPACE, {"metadata": {"name": name, "labels": {"kanri.dev/test": "true"}}})
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(ApiError):
                await client.delete(NAMESPACE, name)


def _seen(seen: list[Request], *wanted: Request) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return all(request in seen for request in wanted)

    return check


async def _config_map(client: Client, namespace: str, name: str) -> None:
    await client.create(CONFIG_MAP, {"metadata": {"name": name, "namespace": namespace}, "data": {"k": "v"}})


async def test_only_the_listed_namespaces_are_cached_and_reconciled(
    client: Client, three_namespaces: list[str]
) -> None:
    a, b, c = three_namespaces
    for namespace in three_namespaces:
        await _config_map(client, namespace, "before-start")
    seen: list[Request] = []

    async def reconcile(request: Request) -> None:
        seen.append(request)
        if request.name == "writer":
            # a write into a namespace nobody watches: the controller must not wait for its echo
            await _config_map(client, c, f"written-{len(seen)}")

    manager = Manager(
        client,
        ManagerOptions(name="namespaces", namespaces=(a, b), leader_election=False, health_port=None),
    )
    manager.add(Controller("namespaces", reconcile, for_kind=CONFIG_MAP))
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        async with asyncio.timeout(60):
            await manager.cache.wait_for_sync([CONFIG_MAP])
            cached = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in manager.cache.list(CONFIG_MAP)}
            # kube-root-ca.crt is published into every namespace by the controller-manager: ignore it
            assert {key for key in cached if key[1] == "before-start"} == {(a, "before-start"), (b, "before-start")}
            assert manager.cache.get(CONFIG_MAP, "before-start", c) is None

            await _config_map(client, b, "later")
            await _config_map(client, c, "later")
            await _config_map(client, a, "writer")
            await eventually(_seen(seen, Request(b, "later"), Request(a, "writer")), timeout=30)
            await _config_map(client, a, "after-writer")
            await eventually(_seen(seen, Request(a, "after-writer")), timeout=30)

            await client.delete(CONFIG_MAP, "before-start", a)

            async def deleted() -> bool:
                return manager.cache.get(CONFIG_MAP, "before-start", a) is None

            await eventually(deleted, timeout=30)
            assert manager.cache.get(CONFIG_MAP, "before-start", b) is not None, "another stream's object stays"
    finally:
        await manager.stop()
        await task
    assert all(r.namespace in (a, b) for r in seen), f"reconciled outside the watched namespaces: {seen}"
    assert Request(c, "later") not in seen
    assert Request(c, "before-start") not in seen
