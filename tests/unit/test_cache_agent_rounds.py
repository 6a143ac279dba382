"""How long the agent's role round waits on a pod whose node lost power: such a pod drops packets instead of refusing
them, so every question to it costs the whole timeout (the real-node Cache test, docs/real-nodes.md). The source and
the peers are asked at once, so a round pays that timeout once, not once per question.

The servers are stood in for at the agent's client boundary (``history`` and ``command`` of
:mod:`kanri.cache.agent.node`); the real servers are in tests/integration/test_real_cache.py and the failover
integration tests."""

from __future__ import annotations

import asyncio
import time

import pytest

from kanri.cache.agent import node as agent
from kanri.cache.agent.fencing import History
from kanri.cache.agent.resp import Secret
from kanri.cache.agent.sources import REPLICATION_USER, source_password

OLD, NEW = "a" * 40, "b" * 40
GONE, ME, PROMOTED = "c-0:6379", "c-1:6379", "c-2:6379"
TIMEOUT = 0.5
"""How long a question to the powered-off pod waits (the agent's is 1 s)."""
NODE = agent.Node("c", ME, (GONE, PROMOTED), ("c-0:26379", "c-1:26379", "c-2:26379"), Secret("s3cret"))
REPLICA = History(host=ME, role="replica", replid=OLD, offset=500, primary_host=GONE)
"""This pod, still naming the primary whose node lost power."""


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The pods' answers: the old primary's node is off (each question waits ``TIMEOUT``, then None), the promoted
    replica holds this pod's history; the commands the agent sends are recorded."""
    promoted = History(host=PROMOTED, role="primary", replid=NEW, offset=520, replid2=OLD, second_offset=501)

    async def history(_node: agent.Node, address: str) -> History | None:
        if address == GONE:
            await asyncio.sleep(TIMEOUT)
            return None
        return {ME: REPLICA, PROMOTED: promoted}[address]

    sent: list[tuple[str, ...]] = []

    async def command(_node: agent.Node, address: str, *args: object) -> object:
        sent.append((address, *(a.value if isinstance(a, Secret) else str(a) for a in args)))
        return ["flags", ["on"]]  # ACL GETUSER: the source has the replication user

    monkeypatch.setattr(agent, "history", history)
    monkeypatch.setattr(agent, "command", command)
    return sent


async def test_a_replica_whose_primary_lost_power_gets_the_promoted_peers_password_within_one_timeout(
    servers: list[tuple[str, ...]],
) -> None:
    guard = agent.SourceGuard()
    started = time.monotonic()
    check = await agent.guard_source(NODE, guard, REPLICA)
    took = time.monotonic() - started
    assert check is not None
    assert not check.allowed, check  # its own source does not answer
    assert guard.approved == PROMOTED
    password = source_password(NODE.password, PROMOTED).value
    assert (ME, "CONFIG", "SET", "masteruser", REPLICATION_USER, "masterauth", password) in servers
    # one after the other, the source and then the peers (the source among them) waited two timeouts
    assert took < 1.6 * TIMEOUT, f"the round took {took:.2f} s for a {TIMEOUT} s timeout"


async def test_a_replica_finds_its_primary_gone_and_asks_the_peers_within_one_timeout(
    servers: list[tuple[str, ...]],
) -> None:
    started = time.monotonic()
    primary, peers = await agent.source_and_peers(NODE, GONE)
    took = time.monotonic() - started
    assert primary is None
    assert [peer.host for peer in peers] == [PROMOTED]
    assert took < 1.6 * TIMEOUT, f"took {took:.2f} s for a {TIMEOUT} s timeout"
    none, answering = await agent.source_and_peers(NODE, None)
    assert none is None
    assert [peer.host for peer in answering] == [PROMOTED]
