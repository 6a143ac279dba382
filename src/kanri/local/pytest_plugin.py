"""pytest fixtures for testing against a real control plane (kanri's envtest).

Enable with ``pytest_plugins = ["kanri.local.pytest_plugin"]``. ``control_plane`` starts one control plane per test
session (it stops with the session, or with the pytest process if that dies); ``kube_api`` is an async
kubernetes_asyncio ``ApiClient`` for it; ``namespace`` gives each test a fresh namespace and deletes it afterwards.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from kanri.local.controlplane import ControlPlane, Endpoint


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """A running control plane for the whole session, on a data dir of its own; its Service range is
    ``KANRI_SERVICE_CIDR`` when set (a session beside another whose host serves 10.96.0.0/16, see tests/tiers.py)."""
    cp = ControlPlane(tmp_path_factory.mktemp("controlplane"))
    endpoint = cp.start(exit_with_parent=True)
    try:
        yield endpoint
    finally:
        cp.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def kube_api(control_plane: Endpoint) -> AsyncIterator[k8s.ApiClient]:
    """An admin API client (user in ``system:masters``) for the session's control plane."""
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(config_file=str(control_plane.kubeconfig), client_configuration=configuration)
    async with k8s.ApiClient(configuration) as api:
        yield api


@pytest_asyncio.fixture(loop_scope="session")
async def namespace(kube_api: k8s.ApiClient, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A new namespace for this test only, named after it; deleted (without waiting) when the test ends."""
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{secrets.token_hex(3)}"
    core = k8s.CoreV1Api(kube_api)
    await core.create_namespace(
        k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels={"kanri.dev/test": "true"}))
    )
    try:
        yield name
    finally:
        await core.delete_namespace(name)
