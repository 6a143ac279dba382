from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.runtime import Client
from tests.tiers import HOST_WIDE_MODULES, REAL_NODE_MODULES

pytest_plugins = ["kanri.local.pytest_plugin"]

_TIERS = {"integration", "e2e"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by the tier folder it lives in, so `-m integration` selects exactly that folder, and the
    integration modules that must not run beside the e2e tier ``host_wide``, those on real nodes alone ``real_nodes``
    (tests/tiers.py)."""
    for item in items:
        path = Path(str(item.fspath))
        if path.parent.name in _TIERS:
            item.add_marker(getattr(pytest.mark, path.parent.name))
        if path.parent.name == "integration" and path.stem in HOST_WIDE_MODULES:
            item.add_marker(pytest.mark.host_wide)
        if path.parent.name == "integration" and path.stem in REAL_NODE_MODULES:
            item.add_marker(pytest.mark.real_nodes)


@pytest_asyncio.fixture(loop_scope="session")
async def client(control_plane: Endpoint) -> AsyncIterator[Client]:
    """A kanri client (raw dicts) for the session's control plane, for one test."""
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as c:
        yield c
