"""The cache takes in the objects our own writes returned, so a reconcile never redoes a write whose watch event has
not arrived yet — but only ever moves an object forward."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from aiohttp import web

from kanri.runtime import Cache, Client, Informer
from kanri.runtime._connection import Connection
from kanri.runtime.kinds import CONFIG_MAP, SECRET


def config_map(rv: str, uid: str = "u1", data: str = "a") -> dict[str, Any]:
    meta = {"name": "c", "namespace": "ns", "uid": uid, "resourceVersion": rv}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": data}}


@pytest.fixture
async def cache() -> AsyncIterator[Cache]:
    # No request is made: the Cache only needs a Client to build informers it never starts here.
    async with Client(Connection("http://127.0.0.1:1")) as client:
        yield Cache(client)


async def test_a_newer_version_of_a_cached_object_replaces_it(cache: Cache) -> None:
    cache.store(CONFIG_MAP).upsert(config_map("10"))
    written = config_map("11", data="b")
    cache.observe_write(CONFIG_MAP, written)
    cached = cache.get(CONFIG_MAP, "c", "ns")
    assert cached is not None
    assert cached["data"] == {"k": "b"}


@pytest.mark.parametrize(
    ("written", "why"),
    [
        (config_map("9", data="old"), "an older version never moves the cache backwards"),
        (config_map("10", data="same"), "the same version is not taken twice"),
        (config_map("11", uid="u2", data="other"), "a recreated object (new uid) waits for its watch event"),
        (config_map("abc", data="opaque"), "non-numeric resourceVersions are not compared"),
    ],
)
async def test_writes_that_are_not_strictly_newer_are_ignored(cache: Cache, written: dict[str, Any], why: str) -> None:
    cache.store(CONFIG_MAP).upsert(config_map("10"))
    cache.observe_write(CONFIG_MAP, written)
    cached = cache.get(CONFIG_MAP, "c", "ns")
    assert cached is not None
    assert cached["data"] == {"k": "a"}, why


async def test_objects_not_yet_cached_and_unwatched_kinds_are_left_to_the_watch(cache: Cache) -> None:
    cache.store(CONFIG_MAP)  # watched, but empty
    cache.observe_write(CONFIG_MAP, config_map("5"))
    assert cache.get(CONFIG_MAP, "c", "ns") is None
    cache.observe_write(SECRET, {**config_map("5"), "kind": "Secret"})
    assert SECRET not in cache._informers


async def test_the_client_hands_each_write_listener_its_own_copy() -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response(config_map("11", data="b"))

    app = web.Application()
    app.router.add_patch("/api/v1/namespaces/ns/configmaps/c", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    heard: list[dict[str, Any]] = []
    try:
        async with Client(Connection(f"http://127.0.0.1:{port}")) as client:
            client.add_write_listener(lambda kind, obj: heard.append(obj))
            client.add_write_listener(lambda kind, obj: heard.append(obj))
            returned = await client.patch(CONFIG_MAP, "c", {"data": {"k": "b"}}, "ns")
    finally:
        await runner.cleanup()
    assert returned == heard[0] == heard[1]
    assert returned is not heard[0], "listeners may keep what they are handed"
    assert heard[0] is not heard[1]


class ScriptedWatch:
    """A Client stand-in whose watch yields the given events once, then ends."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    async def watch(self, *args: Any, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        for event in self.events:
            yield event


async def test_a_write_taken_ahead_stays_until_the_watch_catches_up_and_events_report_real_transitions() -> None:
    events = [{"type": "MODIFIED", "object": config_map("11", data="b")},
              {"type": "MODIFIED", "object": config_map("12", data="c")}]  # fmt: skip
    informer = Informer(cast(Client, ScriptedWatch(events)), CONFIG_MAP)
    informer.store.upsert(config_map("10"))
    assert informer.take_write(config_map("12", data="c"))  # our write; its event is the second one
    seen: list[tuple[str | None, str]] = []
    informer.add_handler(
        lambda e: seen.append(
            ((e.old or {}).get("metadata", {}).get("resourceVersion"), e.obj["metadata"]["resourceVersion"])
        )
    )
    stored: list[str] = []
    original = informer._notify

    def notify(event: Any) -> None:
        original(event)
        stored.append(informer.store.get("ns", "c")["metadata"]["resourceVersion"])  # type: ignore[index]

    informer._notify = notify  # type: ignore[method-assign]
    await informer._watch(None, "10")
    assert stored == ["12", "12"], "an older event never replaces the newer write in the store"
    assert seen == [("10", "11"), ("11", "12")], "each event's old is the previous state the server delivered"
    assert informer.watched("ns", "c")["metadata"]["resourceVersion"] == "12"  # type: ignore[index]
