"""Running a LocalNode inside a test: its own client and caches, ready before the test starts, stopped after."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from kanri.local.node import LocalNode, NodeOptions
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import NODE, PERSISTENT_VOLUME
from tests.support import eventually


def with_test_network(options: NodeOptions) -> NodeOptions:
    """``options`` with a pod network of the tests' own, apart from the defaults a developer's ``kanri local up``
    uses on the same machine (kanri0, 10.244.0.0/16, kanri-svc)."""
    return dataclasses.replace(
        options,
        bridge="kanri-t0",
        pod_cidr="10.246.0.0/16",
        internal_ip="10.246.0.1",
        netns_prefix="kanri-t-",
        service_link="kanri-svce",
    )


def with_kube_proxy(options: NodeOptions, kubeconfig: Path) -> NodeOptions:
    """``options`` with what kube-proxy needs, as ``kanri local up`` gives it: the kubeconfig and the API server's
    address (for the ``kubernetes`` Service's endpoint); ones set already are kept."""
    server = urlsplit(yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"])
    assert server.hostname is not None
    assert server.port is not None
    return dataclasses.replace(
        options,
        kubeconfig=options.kubeconfig or kubeconfig,
        apiserver=options.apiserver or (server.hostname, server.port),
    )


@contextlib.asynccontextmanager
async def running_node(kubeconfig: Path, options: NodeOptions) -> AsyncIterator[LocalNode]:
    """Start a LocalNode, wait until its caches have synced; on exit stop it (awaiting its shutdown) and delete what
    would outlive it: its PersistentVolumes (nobody else reclaims them) and its Node."""
    options = with_kube_proxy(options, kubeconfig)
    async with await Client.from_kubeconfig(str(kubeconfig)) as node_client:
        local = LocalNode(node_client, options)
        task = asyncio.create_task(local.run())
        try:
            await eventually(lambda: asyncio.sleep(0, task.done() or local.manager.ready()), timeout=30)
            assert not task.done(), task.exception()
            # The API server's TaintNodesByCondition admission taints a new Node not-ready until the controller
            # manager sees it Ready: a pod created before that is (rightly) reported with an untolerated taint.
            await eventually(lambda: _untainted(node_client, options.name), timeout=60)
            yield local
        finally:
            local.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 20)
            await _delete_node(node_client, options)


async def _delete_node(client: Client, options: NodeOptions) -> None:
    for volume in (await client.list(PERSISTENT_VOLUME))[0]:
        if volume["spec"].get("local", {}).get("path", "").startswith(str(options.volumes_dir)):
            await client.delete(PERSISTENT_VOLUME, volume["metadata"]["name"])
    with contextlib.suppress(ApiError):  # a test may have deleted it already
        await client.delete(NODE, options.name)


async def _untainted(client: Client, name: str) -> bool:
    node = await client.get(NODE, name)
    taints = (node.get("spec") or {}).get("taints") or []
    return not [t for t in taints if t["key"].startswith("node.kubernetes.io/")]
