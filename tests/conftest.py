from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["kanri.local.pytest_plugin"]

_TIERS = {"integration", "e2e"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by the tier folder it lives in, so `-m integration` selects exactly that folder."""
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, tier))
