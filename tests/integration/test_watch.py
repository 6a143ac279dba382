"""Watches on the real API server deliver bookmarks, which is what keeps a long-lived informer's resourceVersion
fresh (and what lets it notice that a quiet watch is still alive)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kubernetes_asyncio import client as k8s


async def read_watch(response: Any) -> list[dict[str, Any]]:
    """Every event of a raw watch stream until the server closes it."""
    events: list[dict[str, Any]] = []
    async for line in response.content:
        if line.strip():
            events.append(json.loads(line))
    response.release()
    return events


async def test_watch_with_timeout_receives_a_bookmark_before_the_server_closes_it(
    kube_api: k8s.ApiClient, namespace: str
) -> None:
    core = k8s.CoreV1Api(kube_api)
    listed = await core.list_namespaced_config_map(namespace)
    response = await core.list_namespaced_config_map(
        namespace,
        watch=True,
        allow_watch_bookmarks=True,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=6,
        _preload_content=False,
    )
    reading = asyncio.create_task(read_watch(response))
    # The watch cache sends a bookmark only when its resourceVersion moved past where the watch started (no news, no
    # bookmark): a change during the watch guarantees one, about two seconds before the server's timeout.
    await asyncio.sleep(1)
    created = await core.create_namespaced_config_map(
        namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="watched"))
    )
    events = await reading

    types = [e["type"] for e in events]
    # The controller manager publishes kube-root-ca.crt into every new namespace, sometimes during the watch.
    added = [e for e in events if e["type"] == "ADDED" and e["object"]["metadata"]["name"] != "kube-root-ca.crt"]
    assert [e["object"]["metadata"]["name"] for e in added] == ["watched"]
    assert "BOOKMARK" in types, f"no bookmark among {types}"
    bookmark = events[types.index("BOOKMARK")]
    assert types.index("BOOKMARK") > types.index("ADDED")
    # A bookmark carries only a resourceVersion, at least as new as what the watch has delivered.
    assert int(bookmark["object"]["metadata"]["resourceVersion"]) >= int(created.metadata.resource_version)
    assert "data" not in bookmark["object"]


async def test_watch_list_ends_its_initial_events_with_a_bookmark(kube_api: k8s.ApiClient, namespace: str) -> None:
    core = k8s.CoreV1Api(kube_api)
    for name in ("one", "two"):
        await core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name)))

    response = await core.list_namespaced_config_map(
        namespace,
        watch=True,
        allow_watch_bookmarks=True,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        resource_version="",
        timeout_seconds=3,
        _preload_content=False,
    )
    events = await read_watch(response)

    names = [e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED"]
    # kube-root-ca.crt appears once the root-CA publisher controller has reached this namespace.
    assert set(names) - {"kube-root-ca.crt"} == {"one", "two"}
    initial_end = [
        e
        for e in events
        if e["type"] == "BOOKMARK"
        and e["object"]["metadata"].get("annotations", {}).get("k8s.io/initial-events-end") == "true"
    ]
    assert len(initial_end) == 1
    assert events.index(initial_end[0]) > max(i for i, e in enumerate(events) if e["type"] == "ADDED")
