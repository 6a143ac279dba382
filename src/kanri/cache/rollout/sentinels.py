"""Sentinels forget the Sentinels of pods that are gone. Sentinel never forgets a peer, and a replaced pod's Sentinel
comes back with a new ID under the same name (the old entry stays, with an invalid address); a failover needs the
votes of a majority of every Sentinel one knows, so after a scale-down or a rollout the pods left could fail over
only with all of them up. ``SENTINEL RESET`` makes a Sentinel forget and relearn its peers and replicas (in
seconds, from the primary's hello channel). It is sent to one Sentinel at a time, the next only once every Sentinel
knows the replicas again, and never while the Sentinels disagree about the primary or a failover is in progress (a
reset aborts it)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from kanri.cache.agent.resp import UNAVAILABLE, Connection, Secret

__all__ = ["SentinelView", "forget_removed", "to_reset"]


@dataclass(frozen=True)
class SentinelView:
    """What one Sentinel says about the cache (``SENTINEL MASTER``)."""

    primary: str
    """``ip:port`` it names."""
    sentinels: int
    """Other Sentinels it knows (``num-other-sentinels``)."""
    replicas: int
    """Replicas it knows (``num-slaves``)."""
    failing_over: bool


def to_reset(views: Mapping[str, SentinelView | None], pods: int) -> str | None:
    """The pod whose Sentinel should be reset now (pure): one that knows more peers than the cache has, once every
    Sentinel answers, names the same primary, knows every replica and runs no failover."""
    if len(views) != pods or any(view is None for view in views.values()):
        return None
    seen = [view for view in views.values() if view is not None]
    if len({view.primary for view in seen}) != 1 or any(view.failing_over for view in seen):
        return None
    if any(view.replicas < pods - 1 for view in seen):
        return None  # one reset earlier is still relearning
    return next((pod for pod in sorted(views) if (views[pod] or seen[0]).sentinels > pods - 1), None)


async def _call(address: str, password: Secret, *args: str) -> object:
    host, _, port = address.rpartition(":")
    connection = await Connection.open(host, int(port), password, timeout=2.0)
    try:
        return await connection.command(*args)
    finally:
        await connection.close()


async def _view(address: str, password: Secret, master: str) -> SentinelView | None:
    try:
        answer = await _call(address, password, "SENTINEL", "MASTER", master)
    except UNAVAILABLE:
        return None
    if not isinstance(answer, list):
        return None
    fields = dict(zip(answer[::2], answer[1::2], strict=True))
    return SentinelView(primary=f"{fields.get('ip')}:{fields.get('port')}",
                        sentinels=int(fields.get("num-other-sentinels", 0)),
                        replicas=int(fields.get("num-slaves", 0)),
                        failing_over="failover_in_progress" in str(fields.get("flags", "")))  # fmt: skip


async def forget_removed(sentinels: Mapping[str, str], password: Secret, master: str) -> str | None:
    """Reset at most one Sentinel (pod -> ``host:port``, every pod of the cache); returns its pod."""
    names = sorted(sentinels)
    views = dict(zip(names, await asyncio.gather(*(_view(sentinels[n], password, master) for n in names)), strict=True))
    pod = to_reset(views, len(names))
    if pod is None:
        return None
    try:
        await _call(sentinels[pod], password, "SENTINEL", "RESET", master)
    except UNAVAILABLE:
        return None
    return pod
