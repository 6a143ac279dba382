"""Fixtures of the PostgreSQL end-to-end tests: the CRD installed, a local node with the image map, the operator,
and the secret scan every test's namespace goes through when the test ends (tests/e2e/secret_scan.py)."""

from __future__ import annotations

import logging
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.imagemap import default_image_map
from kanri.local.node import LocalNode, NodeOptions
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.runtime import Client
from kanri.runtime.kinds import EVENT
from tests.e2e.secret_scan import SecretScan
from tests.local_node_support import running_node, with_test_network
from tests.postgres_support import Operator, install_postgres_crd


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    """The conftest's client, with the PostgresCluster CRD installed and Established."""
    await install_postgres_crd(client)
    return client


async def failovers_started(client: Client, namespace: str) -> list[str]:
    events, _ = await client.list(EVENT, namespace)
    return [str(e.get("message")) for e in events if e.get("reason") == "FailoverStarted"]


@pytest_asyncio.fixture(loop_scope="session")
async def namespace(
    namespace: str,
    control_plane: Endpoint,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> AsyncIterator[str]:
    """The test's namespace (kanri.local.pytest_plugin's); when the test ends, before the namespace goes, no value of
    a Secret it ever held may appear in its objects, Events, container logs, the test's output or any process's
    argv (issue 16: secrets stay secret). A hit fails the test naming the place and the Secret key, never the value."""
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as own:
        scan = SecretScan(own, namespace)
        await scan.start()
        try:
            yield namespace
        finally:
            await scan.stop()
            out, err = capfd.readouterr()
            sys.stdout.write(out)  # handed back, so that a failing test still shows its output
            sys.stderr.write(err)
            records = [r for phase in ("setup", "call") for r in caplog.get_records(phase)]
            formatter = logging.Formatter("%(name)s %(message)s")
            output = [("the test's stdout", out), ("the test's stderr", err),
                      ("the test's log records", "\n".join(formatter.format(r) for r in records))]  # fmt: skip
            found = await scan.findings(tmp_path, output)
            # A busy 2-core machine must not cause a failover (issue 12): only a test that injects faults may see one.
            spurious = [] if request.node.get_closest_marker("faults") else await failovers_started(own, namespace)
    if spurious:
        pytest.fail(f"spurious failover in a test that injects no fault: {'; '.join(spurious)}")
    if found:
        pytest.fail(f"{len(found)} secret value(s) leaked (values not shown):\n  " + "\n  ".join(sorted(set(found))))


@pytest_asyncio.fixture(loop_scope="session")
async def node(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[LocalNode]:
    options = with_test_network(
        NodeOptions(
            data_dir=tmp_path / "node",
            name=f"test-pg-{secrets.token_hex(3)}",
            images=default_image_map(),
            restart_backoff_base=0.5,
            restart_backoff_max=5.0,
        )
    )
    async with running_node(control_plane.kubeconfig, options) as local:
        yield local


@pytest_asyncio.fixture(loop_scope="session")
async def operator(control_plane: Endpoint, namespace: str) -> AsyncIterator[Operator]:
    instances = HttpInstanceClient()
    try:
        yield Operator(control_plane, namespace, instances=instances)
    finally:
        await instances.close()
