"""A status that says why (issue 15 item 1), end to end: real control plane and scheduler, a local node, the
operator's real Manager. Before, a cluster whose pods could not run sat in ``Provisioning`` saying "pod Pending" with
``Degraded=False``; now ``kubectl describe`` shows the cause under its own reason, with the underlying message and
a runbook, and the condition clears once the cause is fixed.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.imagemap import POSTGRES_IMAGE, default_image_map
from kanri.local.node import LocalNode, NodeOptions
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import EVENT, NODE
from tests.e2e.postgres_helpers import cluster, ready
from tests.local_node_support import running_node, with_test_network
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
KUBECTL = Path(sys.executable).parent / "kubectl"
UNMAPPED = 16  # left out of this module's image map: its pods wait with ImageNotMapped


@pytest_asyncio.fixture(loop_scope="session")
async def node(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[LocalNode]:
    """The e2e node, with no image for PostgreSQL ``UNMAPPED`` whatever this machine has installed."""
    images = [e for e in default_image_map() if e["image"] != f"{POSTGRES_IMAGE}:{UNMAPPED}"]
    name = f"test-pp-{secrets.token_hex(3)}"
    options = NodeOptions(
        data_dir=tmp_path / "node", name=name, images=images, restart_backoff_base=0.5, restart_backoff_max=5.0
    )
    options = with_test_network(options)
    async with running_node(control_plane.kubeconfig, options) as local:
        yield local


async def degraded(client: Client, namespace: str, name: str, reason: str) -> Obj | None:
    status = (await client.get(POSTGRES_CLUSTER, name, namespace)).get("status") or {}
    found = get_condition(status.get("conditions"), "Degraded")
    return dict(found) if found is not None and found["status"] == "True" and found["reason"] == reason else None


async def not_degraded(client: Client, namespace: str, name: str) -> Obj | None:
    status = (await client.get(POSTGRES_CLUSTER, name, namespace)).get("status") or {}
    found = get_condition(status.get("conditions"), "Degraded")
    return dict(found) if found is not None and found["status"] == "False" else None


async def warning(client: Client, namespace: str, name: str, reason: str) -> Obj | None:
    events = (await client.list(EVENT, namespace))[0]
    return next((e for e in events if e.get("type") == "Warning" and e.get("reason") == reason
                 and (e.get("involvedObject") or {}).get("name") == name), None)  # fmt: skip


async def describe(control_plane: Endpoint, namespace: str, name: str) -> str:
    """``kubectl describe pgc``, as a user runs it, on one line (it wraps long messages)."""
    process = await asyncio.create_subprocess_exec(
        str(KUBECTL), f"--kubeconfig={control_plane.kubeconfig}", "describe", "pgc", name, "-n", namespace,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await process.communicate()
    assert process.returncode == 0, output.decode()
    return " ".join(output.decode().split())


async def test_an_unschedulable_cluster_says_why_and_recovers_once_a_node_fits(
    client: Client, node: LocalNode, operator: Operator, namespace: str, control_plane: Endpoint
) -> None:
    pool = f"pool-{secrets.token_hex(3)}"
    spec = {"podTemplate": {"nodeSelector": {"kanri.test/pool": pool}}}
    await client.create(POSTGRES_CLUSTER, cluster("stuck", namespace, 1, **spec))
    async with operator.running(refresh=2.0):
        found = await eventually(lambda: degraded(client, namespace, "stuck", "Unschedulable"), timeout=90)
        # The scheduler's own words, naming why no node fits, and where to read on.
        assert "instance stuck-1: its pod cannot be scheduled: 0/" in found["message"], found
        assert "didn't match Pod's node affinity/selector" in found["message"], found
        assert "docs/runbooks/Unschedulable.md" in found["message"]
        text = await describe(control_plane, namespace, "stuck")
        assert "Reason: Unschedulable" in text, text
        assert "didn't match Pod's node affinity/selector" in text, text
        assert await eventually(lambda: warning(client, namespace, "stuck", "Unschedulable"), timeout=30)
        # The fix: a node with the label the cluster asks for. The scheduler retries by itself.
        await client.patch(NODE, node.name, {"metadata": {"labels": {"kanri.test/pool": pool}}})
        assert await eventually(lambda: ready(client, namespace, "stuck", 1), timeout=180)
        cleared = await eventually(lambda: not_degraded(client, namespace, "stuck"), timeout=30)
        assert cleared["reason"] == "AsExpected"


async def test_an_image_the_node_cannot_run_is_image_pull_failed_not_pending(
    client: Client, node: LocalNode, operator: Operator, namespace: str, control_plane: Endpoint
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster("noimage", namespace, 1, version=UNMAPPED))
    async with operator.running(refresh=2.0):
        found = await eventually(lambda: degraded(client, namespace, "noimage", "ImagePullFailed"), timeout=90)
        image = f"{POSTGRES_IMAGE}:{UNMAPPED}"
        assert f"instance noimage-1: image {image} of container postgres cannot be pulled" in found["message"]
        assert "is not mapped to a local program" in found["message"], found  # the local node's own message
        status = (await client.get(POSTGRES_CLUSTER, "noimage", namespace))["status"]
        assert status["phase"] == "Provisioning"  # still on its way as far as the lifecycle goes, but it says why
        text = await describe(control_plane, namespace, "noimage")
        assert "Reason: ImagePullFailed" in text, text
        assert "docs/runbooks/ImagePullFailed.md" in text, text
