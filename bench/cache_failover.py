"""Fault → writes accepted again, for a Cache's pods as local processes (the in-pod agent's code, real valkey-server
and Sentinel; no cluster): issue 31's anchor is Sentinel's own 2.3 s (quorum 2, down-after 1000 ms).

    python bench/cache_failover.py [--runs 5] [--faults kill,empty-restart] [--down-after 1000]

``kill``: the primary (Durable, AOF everysec) is SIGKILLed and stays down; Sentinel's down-after decides.
``empty-restart``: the primary (Regenerable) is SIGKILLed and restarted at once, empty; the agent fences it and asks
Sentinel to fail over (no down-after wait). Each run measures from the fault to the first write a new primary
acknowledges with ``WAIT 1``, then checks that no such write was lost. Prints every run, the median and the maximum.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' local cache helpers

from kanri.cache.agent.node import command
from kanri.cache.api import CacheSpec
from tests.cache_support import Ledger, LocalCache
from tests.support import NotYet, eventually


class SetupFailed(Exception):
    """The fresh cache never settled (before any fault): e.g. a server's port, picked free, was taken meanwhile."""


def spec(fault: str, down_after: int) -> CacheSpec:
    if fault == "kill":
        return CacheSpec.model_validate({"dataPolicy": "Durable", "replicas": 3, "storage": {"size": "1Gi"},
                                         "downAfterMilliseconds": down_after})  # fmt: skip
    return CacheSpec(data_policy="Regenerable", replicas=3, down_after_milliseconds=down_after)


async def settled(cache: LocalCache) -> str:
    """One primary, every other pod linked to it, and every Sentinel knowing both replicas."""

    async def check() -> str | None:
        seen = await cache.histories()
        leads = [h.host for h in seen if h is not None and h.role == "primary"]
        if len(leads) != 1:
            return None
        if not all(h is not None and (h.host == leads[0] or (h.primary_host == leads[0] and h.link_up)) for h in seen):
            return None
        node = cache.pods[0].server
        known = [await command(node, p.sentinel.me, "SENTINEL", "REPLICAS", cache.name) for p in cache.pods]
        return leads[0] if all(len(k) == len(cache.pods) - 1 for k in known) else None

    return await eventually(check, timeout=60)


async def one_run(fault: str, down_after: int) -> tuple[float, int, int]:
    """Seconds from the fault to the first replicated write on a new primary; writes acknowledged; writes lost."""
    with tempfile.TemporaryDirectory() as root:
        cache = LocalCache(Path(root), spec(fault, down_after))
        try:
            await cache.start()
            try:
                old = await settled(cache)
            except NotYet as exc:
                raise SetupFailed(str(exc)) from exc
            ledger, done = Ledger(cache, replicas=1), asyncio.Event()
            writer = asyncio.create_task(ledger.run(done))

            async def acknowledged(count: int) -> bool:
                return len(ledger.acknowledged) > count

            await eventually(lambda: acknowledged(300), timeout=30)
            index = [p.server.me for p in cache.pods].index(old)
            start = time.monotonic()
            if fault == "kill":
                cache.kill(index)
            else:
                await cache.restart(index)

            moved_at: list[int] = []  # the count when the writer first found a new primary

            async def resumed() -> bool:
                if not moved_at and ledger.primary_seen not in (None, old):
                    moved_at.append(len(ledger.acknowledged))
                return bool(moved_at) and len(ledger.acknowledged) > moved_at[0]

            await eventually(resumed, timeout=60, interval=0.01)
            elapsed = time.monotonic() - start
            done.set()
            await writer
            client = cache.client(ledger.primary_seen or "")
            try:
                present = int(await client.exists(*ledger.acknowledged))
            finally:
                await client.aclose()
            return elapsed, len(ledger.acknowledged), len(ledger.acknowledged) - present
        finally:
            await cache.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--faults", default="kill,empty-restart")
    parser.add_argument("--down-after", type=int, default=1000)
    args = parser.parse_args()
    for fault in args.faults.split(","):
        times = []
        for run in range(args.runs):
            for attempt in (1, 2, 3):  # a setup that failed measured nothing: start a fresh cache again
                try:
                    elapsed, acknowledged, lost = await one_run(fault, args.down_after)
                    break
                except SetupFailed as exc:
                    print(f"{fault} run {run + 1}: the cache did not settle before the fault ({exc}); "
                          f"{'again' if attempt < 3 else 'giving up'}", flush=True)  # fmt: skip
                    if attempt == 3:
                        raise
            times.append(elapsed)
            print(f"{fault} run {run + 1}: writes accepted again after {elapsed:.2f} s; {acknowledged} acknowledged "
                  f"with WAIT 1, {lost} lost", flush=True)  # fmt: skip
        print(f"{fault}: median {statistics.median(times):.2f} s, max {max(times):.2f} s over {len(times)} runs")


if __name__ == "__main__":
    asyncio.run(main())
