"""Restarting instances whose configuration changed in a way only a restart applies (``pendingRestart``).

One at a time, replicas first and the primary last, and only while every instance is ready: a restart never
takes a second instance down, and the primary restarts once its replicas run the new settings (PostgreSQL refuses
to run a hot standby with, say, a ``max_connections`` lower than its primary's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kanri.postgres.instances import InstanceReport

__all__ = ["next_restart"]


def next_restart(instances: Sequence[str], primary: str | None, reports: Mapping[str, InstanceReport]) -> str | None:
    """The instance to restart now, or None (nothing pending, or someone is not ready yet)."""
    pending = [name for name in instances if (r := reports.get(name)) is not None and r.pending_restart]
    if not pending:
        return None
    if any((r := reports.get(name)) is None or not r.ready for name in instances):
        return None  # one at a time: wait until the previous restart (or anything else) has settled
    replicas = [name for name in pending if name != primary]
    return replicas[0] if replicas else pending[0]
