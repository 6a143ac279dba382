"""The planned switchover of a rolling replace (kanri.cache.rollout.switchover) against real valkey-server and
Sentinel processes run by the in-pod agent's code (no cluster): with a WAIT ledger writing throughout, the primary
moves to an up-to-date replica, the old primary follows it, no WAIT-confirmed write is lost and never two pods accept
writes; a replica leaving with a scale-down is never the one promoted, and once it is gone the Sentinels that stay
forget its Sentinel (else a failover would need every one of them)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from kanri.cache.agent.node import command, stop
from kanri.cache.agent.resp import Secret
from kanri.cache.api import CacheSpec
from kanri.cache.rollout.sentinels import forget_removed
from kanri.cache.rollout.switchover import Topology, switch_over
from tests.cache_support import Ledger, LocalCache
from tests.support import eventually

DURABLE = CacheSpec.model_validate(
    {"dataPolicy": "Durable", "replicas": 3, "storage": {"size": "1Gi"}, "downAfterMilliseconds": 1000}
)


@pytest_asyncio.fixture(loop_scope="session")
async def durable(tmp_path: Path) -> AsyncIterator[LocalCache]:
    cache = LocalCache(tmp_path, DURABLE)
    try:
        await cache.start()
        yield cache
    finally:
        await cache.close()


async def settled(cache: LocalCache) -> int:
    """The index of the one primary once every other pod replicates from it and every Sentinel knows every replica
    (Sentinel learns them from the primary's INFO every 10 s; before that it has none to promote)."""

    async def check() -> int | None:
        seen = await cache.histories()
        leads = [i for i, h in enumerate(seen) if h is not None and h.role == "primary"]
        if len(leads) != 1:
            return None
        lead = seen[leads[0]]
        assert lead is not None
        if not all(h is not None and (h is lead or (h.primary_host == lead.host and h.link_up)) for h in seen):
            return None
        node = cache.pods[0].server
        for pod in cache.pods:
            known = await command(node, pod.sentinel.me, "SENTINEL", "REPLICAS", cache.name)
            named = await command(node, pod.sentinel.me, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", cache.name)
            if len(known) != len(cache.pods) - 1 or f"{named[0]}:{named[1]}" != lead.host:
                return None
        return leads[0]

    return await eventually(check, timeout=40)


async def stop_pod(cache: LocalCache, index: int) -> None:
    pod = cache.pods[index]
    if pod.role is not None:
        pod.role.cancel()
    for process in (pod.process, pod.sentinel_process):
        if process is not None:
            await stop(process, timeout=5)


def topology(cache: LocalCache, primary: int, candidates: list[int], others: list[int] = ()) -> Topology:  # type: ignore[assignment]
    return Topology(
        master=cache.name,
        primary=(f"pod-{primary}", cache.pods[primary].server.me),
        candidates={f"pod-{i}": cache.pods[i].server.me for i in candidates},
        sentinels=[pod.sentinel.me for pod in cache.pods],
        others=[cache.pods[i].server.me for i in others],
    )


async def test_a_planned_switchover_loses_no_confirmed_write_and_never_leaves_two_writable_primaries(
    durable: LocalCache,
) -> None:
    cache = durable
    password = Secret(cache.password)
    first = await settled(cache)
    ledger = Ledger(cache, replicas=1)
    done = asyncio.Event()
    writable: list[list[str]] = []

    async def watch() -> None:
        while not done.is_set():
            seen = await cache.histories()
            writable.append([h.host for h in seen if h is not None and h.writable])
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(ledger.run(done)), asyncio.create_task(watch())]

    async def acknowledged_beyond(count: int) -> bool:
        return len(ledger.acknowledged) > count

    await eventually(lambda: acknowledged_beyond(300), timeout=30)
    others = [i for i in range(3) if i != first]
    outcome = await switch_over(topology(cache, first, others), password)
    assert outcome.promoted in {f"pod-{i}" for i in others}, outcome.reason
    second = int(outcome.promoted.rsplit("-", 1)[1])
    old = (await cache.histories())[first]
    assert old is not None
    assert old.role == "replica", "the old primary follows the new one at once (not when Sentinel gets to it)"
    assert old.primary_host == cache.pods[second].server.me
    moved = len(ledger.acknowledged)
    await eventually(lambda: acknowledged_beyond(moved + 300), timeout=30)  # writes go on at the new primary

    # a scale-down: the third pod leaves, so only the old primary may take over
    assert await settled(cache) == second
    leaving = next(i for i in range(3) if i not in (first, second))
    back = await switch_over(topology(cache, second, [first], others=[leaving]), password)
    assert back.promoted == f"pod-{first}", back.reason
    again = len(ledger.acknowledged)
    await eventually(lambda: acknowledged_beyond(again + 300), timeout=30)
    done.set()
    await asyncio.gather(*tasks)

    client = cache.client(cache.pods[first].server.me)
    try:
        present = await client.exists(*ledger.acknowledged)
    finally:
        await client.aclose()
    assert present == len(ledger.acknowledged), f"{len(ledger.acknowledged) - present} confirmed writes lost"
    assert max(len(p) for p in writable) == 1, f"two writable primaries: {[p for p in writable if len(p) > 1]}"
    priority = await command(cache.pods[leaving].server, cache.pods[leaving].server.me, "CONFIG", "GET",
                             "replica-priority")  # fmt: skip
    assert priority[1] == "100", "the leaving replica's exclusion is undone"
    # the leaving pod goes; the Sentinels that stay forget it, one at a time
    await stop_pod(cache, leaving)
    staying = {f"pod-{i}": cache.pods[i].sentinel.me for i in (first, second)}
    node = cache.pods[first].server

    async def forgotten() -> list[int] | None:
        await forget_removed(staying, password, cache.name)
        counts = []
        for address in staying.values():
            master = await command(node, address, "SENTINEL", "MASTER", cache.name)
            fields = dict(zip(master[::2], master[1::2], strict=True))
            counts += [int(fields["num-other-sentinels"]), int(fields["num-slaves"])]
        return counts if counts == [1, 1, 1, 1] else None

    await eventually(forgotten, timeout=60)
