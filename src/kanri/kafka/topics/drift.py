"""Topic settings: what to set and what to drop so the topic's own settings are exactly the spec's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ConfigChange:
    set: dict[str, str] = field(default_factory=dict)
    """Keys whose value differs from the spec's, or that the topic lacks."""
    remove: list[str] = field(default_factory=list)
    """Keys set on the topic that the spec does not name (back to the broker's default)."""

    def __bool__(self) -> bool:
        return bool(self.set or self.remove)

    def keys(self) -> list[str]:
        return sorted([*self.set, *self.remove])


def config_change(desired: Mapping[str, str], actual: Mapping[str, str]) -> ConfigChange:
    """The change that makes ``actual`` (the topic's own settings) equal ``desired``."""
    to_set = {k: v for k, v in desired.items() if actual.get(k) != v}
    to_remove = sorted(k for k in actual if k not in desired)
    return ConfigChange(to_set, to_remove)
