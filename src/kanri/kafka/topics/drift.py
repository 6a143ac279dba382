"""Topic settings: what to set and what to drop so the topic's own settings are exactly the spec's."""

from __future__ import annotations

from collections.abc import Collection, Mapping
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


def config_change(desired: Mapping[str, str], actual: Mapping[str, str], owned: Collection[str] = ()) -> ConfigChange:
    """The change that makes ``actual`` (the topic's own settings) equal ``desired``; ``owned`` keys (the
    replication throttle the operator sets while it moves replicas) are neither set nor dropped here."""
    to_set = {k: v for k, v in desired.items() if actual.get(k) != v and k not in owned}
    to_remove = sorted(k for k in actual if k not in desired and k not in owned)
    return ConfigChange(to_set, to_remove)
