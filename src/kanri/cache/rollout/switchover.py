"""A planned switchover on real Valkey servers and Sentinels: pause writes on the primary, wait until every candidate
replica holds every write, fence the old primary (a replica of nothing), have Sentinel promote a candidate, make the
old primary its replica, then let writes go on.

Writes are paused (``CLIENT PAUSE ... WRITE``, which also stops the primary's replication pings, so offsets stand
still) from before the offsets are compared until the old primary is a replica: no write can reach a primary that is
about to lose it, and a write a client saw ``WAIT`` confirm is on every candidate. Replicas that are not candidates
(leaving with a scale-down, or behind) get ``replica-priority 0`` meanwhile, so Sentinel never picks them. The pause
has a timeout, so an operator that dies mid-way leaves nothing paused for long.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog

from kanri.cache.agent.node import FENCED_PRIMARY
from kanri.cache.agent.resp import UNAVAILABLE, Connection, Secret

__all__ = ["PAUSE_MS", "PLANNED", "Outcome", "Topology", "switch_over"]

log = structlog.get_logger("kanri.cache.rollout")

PLANNED = "planned switchover"
"""How a planned switchover's failover record's reason starts (metrics and alerts tell it from Sentinel's own)."""
PAUSE_MS = 15_000
"""Longest writes stay paused on the old primary (also if the operator dies mid-way)."""
CATCH_UP_SECONDS = 5.0
PROMOTION_SECONDS = 10.0
EXCLUSION_SECONDS = 15.0
DEFAULT_PRIORITY = "100"


@dataclass(frozen=True)
class Topology:
    """Who takes part, every address ``host:port``."""

    master: str
    """The Sentinels' name for the cache (the Cache's name)."""
    primary: tuple[str, str]
    """The primary's pod and server address."""
    candidates: Mapping[str, str]
    """Replicas that may be promoted: pod -> server address."""
    sentinels: Sequence[str]
    others: Sequence[str] = ()
    """Replicas' server addresses Sentinel must not pick (leaving with a scale-down)."""


@dataclass(frozen=True)
class Outcome:
    """``promoted``: the pod that is primary now (None: the switchover did not happen, ``reason`` says why)."""

    promoted: str | None
    reason: str


async def _connect(address: str, password: Secret) -> Connection:
    host, _, port = address.rpartition(":")
    return await Connection.open(host, int(port), password, timeout=2.0)


async def _command(address: str, password: Secret, *args: str | int) -> object:
    connection = await _connect(address, password)
    try:
        return await connection.command(*args)
    finally:
        await connection.close()


async def _replication(address: str, password: Secret) -> Mapping[str, object] | None:
    try:
        connection = await _connect(address, password)
    except UNAVAILABLE:
        return None
    try:
        return await connection.info("replication")
    except UNAVAILABLE:
        return None
    finally:
        await connection.close()


async def _offset(address: str, password: Secret) -> int | None:
    info = await _replication(address, password)
    return None if info is None else int(str(info.get("master_repl_offset", 0)))


async def _caught_up(primary: str, candidates: Mapping[str, str], password: Secret) -> list[str]:
    """Candidates (pod -> address) whose offset reached the paused primary's, waiting up to CATCH_UP_SECONDS."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CATCH_UP_SECONDS
    while True:
        target = await _offset(primary, password)
        offsets = await asyncio.gather(*(_offset(address, password) for address in candidates.values()))
        ready = [pod for pod, offset in zip(candidates, offsets, strict=True)
                 if target is not None and offset is not None and offset >= target]  # fmt: skip
        if len(ready) == len(candidates) or loop.time() >= deadline:
            return ready
        await asyncio.sleep(0.1)


async def _set_priority(addresses: Sequence[str], password: Secret, priority: str) -> None:
    for address in addresses:
        with contextlib.suppress(*UNAVAILABLE):
            await _command(address, password, "CONFIG", "SET", "replica-priority", priority)


async def _sentinel(sentinels: Sequence[str], password: Secret, master: str) -> str | None:
    """The first Sentinel that answers for ``master`` (``SENTINEL FAILOVER`` makes it run the failover itself)."""
    for address in sentinels:
        if await _named(address, password, master) is not None:
            return address
    return None


async def _excluded_seen(sentinel: str, password: Secret, master: str, count: int) -> bool:
    """The Sentinel has read ``replica-priority 0`` from at least ``count`` replicas (it reads a replica's INFO every
    10 s, and picks by what it read last), waiting up to EXCLUSION_SECONDS."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + EXCLUSION_SECONDS
    while loop.time() < deadline:
        with contextlib.suppress(*UNAVAILABLE):
            replicas = await _command(sentinel, password, "SENTINEL", "REPLICAS", master)
            fields = [dict(zip(entry[::2], entry[1::2], strict=True)) for entry in replicas or []]  # type: ignore[attr-defined]
            if sum(1 for entry in fields if entry.get("slave-priority") == "0") >= count:
                return True
        await asyncio.sleep(0.5)
    return False


async def _promoted(candidates: Mapping[str, str], password: Secret) -> str | None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PROMOTION_SECONDS
    while loop.time() < deadline:
        for pod, address in candidates.items():
            info = await _replication(address, password)
            if info is not None and info.get("role") == "master":
                return pod
        await asyncio.sleep(0.2)
    return None


async def _promote(master: str, candidates: Mapping[str, str], sentinel: str, password: Secret) -> str | None:
    try:
        await _command(sentinel, password, "SENTINEL", "FAILOVER", master)
    except UNAVAILABLE as exc:
        log.info("Sentinel refused a planned switchover", sentinel=sentinel, error=str(exc))
        return None
    return await _promoted(candidates, password)


async def _renamed(sentinel: str, password: Secret, master: str, before: list[str] | None) -> list[str] | None:
    """The primary the Sentinel names once it has switched (the new primary's address as the pods know it: its DNS
    name), waiting up to PROMOTION_SECONDS; None when it has not."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PROMOTION_SECONDS
    while loop.time() < deadline:
        named = await _named(sentinel, password, master)
        if named is not None and named != before:
            return named
        await asyncio.sleep(0.1)
    return None


async def _named(sentinel: str, password: Secret, master: str) -> list[str] | None:
    with contextlib.suppress(*UNAVAILABLE):
        answer = await _command(sentinel, password, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", master)
        return [str(part) for part in answer] if isinstance(answer, list) and len(answer) == 2 else None
    return None


async def switch_over(topology: Topology, password: Secret) -> Outcome:
    """Move the primary to one of the candidates (every one must catch up with the paused primary)."""
    sentinel = await _sentinel(topology.sentinels, password, topology.master)
    if sentinel is None:
        return Outcome(None, "no Sentinel answers")
    others = topology.others
    try:
        await _set_priority(others, password, "0")
        if others and not await _excluded_seen(sentinel, password, topology.master, len(others)):
            why = f"the Sentinel did not see the leaving replicas excluded within {EXCLUSION_SECONDS:.0f} s"
            return Outcome(None, why)
        return await _paused_failover(topology.master, topology.primary, topology.candidates, sentinel, password)
    finally:
        await _set_priority(others, password, DEFAULT_PRIORITY)


async def _paused_failover(master: str, primary: tuple[str, str], candidates: Mapping[str, str], sentinel: str,
                           password: Secret) -> Outcome:  # fmt: skip
    old, old_address = primary
    before = await _named(sentinel, password, master)
    await _command(old_address, password, "CLIENT", "PAUSE", PAUSE_MS, "WRITE")
    try:
        ready = await _caught_up(old_address, candidates, password)
        if len(ready) < len(candidates):
            late = ", ".join(sorted(set(candidates) - set(ready)))
            return Outcome(
                None, f"{late} did not catch up with the paused primary {old} within {CATCH_UP_SECONDS:.0f} s"
            )
        # fenced (a replica of nothing) before Sentinel promotes: it answers as no primary, so no pod's agent takes
        # the promoted replica for a second primary while the Sentinels still name the old one
        await _command(old_address, password, "REPLICAOF", *FENCED_PRIMARY.split())
        promoted = await _promote(master, candidates, sentinel, password)
        if promoted is None:
            named = await _named(sentinel, password, master)
            if named == before:  # nobody was promoted: the old primary, which holds every write, leads again
                await _command(old_address, password, "REPLICAOF", "NO", "ONE")
            return Outcome(None, f"no replica was promoted within {PROMOTION_SECONDS:.0f} s")
        named = await _renamed(sentinel, password, master, before)
        if named is None:  # the old primary stays fenced: no second primary; the next look replaces it
            return Outcome(None, f"{promoted} was promoted but the Sentinel did not switch to it within "
                           f"{PROMOTION_SECONDS:.0f} s; {old} stays fenced")  # fmt: skip
        await _command(old_address, password, "REPLICAOF", named[0], named[1])  # the address the pods know it by
        return Outcome(promoted, f"{PLANNED} from {old} to {promoted}: writes paused until it held them all")
    finally:
        with contextlib.suppress(*UNAVAILABLE):
            await _command(old_address, password, "CLIENT", "UNPAUSE")
