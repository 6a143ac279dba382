"""Fixtures of the PostgreSQL end-to-end tests: the CRD installed, a local node with the image map, the operator."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.imagemap import default_image_map
from kanri.local.node import LocalNode, NodeOptions
from kanri.postgres.instances import HttpInstanceClient
from kanri.runtime import Client
from tests.local_node_support import running_node, with_test_network
from tests.postgres_support import Operator, install_postgres_crd


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    """The conftest's client, with the PostgresCluster CRD installed and Established."""
    await install_postgres_crd(client)
    return client


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
