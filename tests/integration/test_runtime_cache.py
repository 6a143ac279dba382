"""The cache serves only the kinds it watches, on the real API server: reading any other kind is an error that
says what to do, never an empty answer; ``wait_for_sync`` starts an informer for such a kind and waits for it."""

from __future__ import annotations

import asyncio

import pytest

from kanri.runtime import Client, Controller, Manager, ManagerOptions, NotWatchedError, Request
from kanri.runtime.kinds import CONFIG_MAP, SECRET


async def test_reading_a_kind_no_controller_watches_raises_until_its_informer_is_started(
    client: Client, namespace: str
) -> None:
    await client.create(SECRET, {"metadata": {"name": "token", "namespace": namespace}, "stringData": {"a": "b"}})

    async def reconcile(_: Request) -> None:
        return None

    manager = Manager(
        client, ManagerOptions(name="cache", namespace=namespace, leader_election=False, health_port=None)
    )
    manager.add(Controller("cache", reconcile, for_kind=CONFIG_MAP))
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        async with asyncio.timeout(30):
            await manager.cache.wait_for_sync([CONFIG_MAP])
            with pytest.raises(NotWatchedError, match=r"Secret\.v1 is not in the cache: no controller owns or watches"):
                manager.cache.get(SECRET, "token", namespace)
            with pytest.raises(NotWatchedError):
                manager.cache.list(SECRET, namespace)

            await manager.cache.wait_for_sync([SECRET])
            secret = manager.cache.get(SECRET, "token", namespace)
            assert secret is not None
            assert secret["metadata"]["name"] == "token"
            assert [s["metadata"]["name"] for s in manager.cache.list(SECRET, namespace)] == ["token"]
    finally:
        await manager.stop()
        await task
