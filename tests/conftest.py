from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.runtime import Client

pytest_plugins = ["kanri.local.pytest_plugin"]

_TIERS = {"integration", "e2e"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by the tier folder it lives in, so `-m integration` selects exactly that folder."""
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest_asyncio.fixture(loop_scope="session")
async def client(control_plane: Endpoint) -> AsyncIterator[Client]:
    """A kanri client (raw dicts) for the session's control plane, for one test."""
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as c:
        yield c
