"""Running a node host inside a test: its own client and caches, ready before the test starts, stopped after."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from kanri.local.node import LocalNode, NodeHost, NodeOptions
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import NAMESPACE, NODE, PERSISTENT_VOLUME
from tests.support import eventually


def with_test_network(options: NodeOptions) -> NodeOptions:
    """``options`` with a pod network of the tests' own, apart from the defaults a developer's ``kanri local up``
    uses on the same machine (kanri0, 10.244.0.0/16, kanri-svc, the kanri-chaos tables)."""
    return dataclasses.replace(
        options,
        bridge="kanri-t0",
        pod_cidr="10.246.0.0/16",
        internal_ip="10.246.0.1",
        netns_prefix="kanri-t-",
        service_link="kanri-svce",
        chaos_table="kanri-chaos-t",
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
async def running_nodes(kubeconfig: Path, options: NodeOptions, count: int = 3) -> AsyncIterator[NodeHost]:
    """Start a node host with ``count`` nodes (``<options.name>-1`` …), wait until its caches have synced and every
    node is schedulable; on exit stop it (awaiting its shutdown) and delete what would outlive it: its nodes'
    PersistentVolumes (nobody else reclaims them) and its Nodes."""
    options = with_kube_proxy(options, kubeconfig)
    async with await Client.from_kubeconfig(str(kubeconfig)) as client:
        host = NodeHost(client, options, count)
        task = asyncio.create_task(host.run())
        try:
            await eventually(lambda: asyncio.sleep(0, task.done() or host.manager.ready()), timeout=30)
            assert not task.done(), task.exception()
            # The API server's TaintNodesByCondition admission taints a new Node not-ready until the controller
            # manager sees it Ready: a pod created before that is (rightly) reported with an untolerated taint.
            for node in host.nodes:
                await eventually(functools.partial(untainted, client, node.name), timeout=60)
            yield host
        finally:
            host.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
            for node in host.nodes:
                await _delete_node(client, node.options)


@contextlib.asynccontextmanager
async def running_node(kubeconfig: Path, options: NodeOptions) -> AsyncIterator[LocalNode]:
    """A host with one node (``<options.name>-1``); yields that node (its host: ``running_node.host``)."""
    async with running_nodes(kubeconfig, options, count=1) as host:
        yield host.nodes[0]


async def _delete_node(client: Client, options: NodeOptions) -> None:
    for volume in (await client.list(PERSISTENT_VOLUME))[0]:
        if volume["spec"].get("local", {}).get("path", "").startswith(str(options.volumes_dir.resolve())):
            await client.delete(PERSISTENT_VOLUME, volume["metadata"]["name"])
    with contextlib.suppress(ApiError):  # a test may have deleted it already
        await client.delete(NODE, options.name)


async def allow_privileged_pods(client: Client, namespace: str) -> None:
    """Opt ``namespace`` into Pod Security ``privileged``, as a platform admin would. The local cluster enforces
    ``baseline`` on namespaces without a level (docs/local.md), which refuses ``hostPath``: node tests that share a
    directory of the host with their pods need this; a tenant cannot set it (namespaces are cluster-scoped)."""
    labels = {"pod-security.kubernetes.io/enforce": "privileged"}
    await client.patch(NAMESPACE, namespace, {"metadata": {"labels": labels}})


async def untainted(client: Client, name: str) -> bool:
    """Whether the Node carries no ``node.kubernetes.io/*`` taint (not-ready, unreachable, …)."""
    node = await client.get(NODE, name)
    taints = (node.get("spec") or {}).get("taints") or []
    return not [t for t in taints if t["key"].startswith("node.kubernetes.io/")]


def init_pid(node: LocalNode, namespace: str, name: str, container: str = "main") -> int | None:
    """The container's init (PID 1 in its PID namespace), as the host sees it; None while it does not run."""
    for worker in node.kubelet.workers.values():
        if (worker.namespace, worker.name) == (namespace, name):
            return worker.init_pids.get(container)
    return None
