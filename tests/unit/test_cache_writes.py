"""The cache takes in the objects our own writes returned, so a reconcile never redoes a write whose watch event has
not arrived yet — but only ever moves an object forward."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s_client

from kanri.runtime import Cache, Client
from kanri.runtime.kinds import CONFIG_MAP, SECRET


def config_map(rv: str, uid: str = "u1", data: str = "a") -> dict[str, Any]:
    meta = {"name": "c", "namespace": "ns", "uid": uid, "resourceVersion": rv}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": data}}


@pytest.fixture
async def cache() -> AsyncIterator[Cache]:
    # No request is made: the Cache only needs a Client to build informers it never starts here.
    async with Client(k8s_client.ApiClient(k8s_client.Configuration(host="http://127.0.0.1:1"))) as client:
        yield Cache(client)


async def test_a_newer_version_of_a_cached_object_replaces_it(cache: Cache) -> None:
    cache.store(CONFIG_MAP).upsert(config_map("10"))
    written = config_map("11", data="b")
    cache.observe_write(CONFIG_MAP, written)
    cached = cache.get(CONFIG_MAP, "c", "ns")
    assert cached is not None
    assert cached["data"] == {"k": "b"}
    written["data"]["k"] = "mutated by the caller"
    assert cached["data"] == {"k": "b"}, "the cache keeps its own copy"


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
