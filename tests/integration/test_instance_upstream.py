"""A replica's instance manager remembers what its WAL receiver last heard of the primary's WAL end, and keeps
reporting it (``upstream`` in ``GET /status``, aged on its own clock) after the receiver lost the primary — the
evidence a restarted operator bounds a failover's loss with (issue 29 item 11).

Real PostgreSQL 15 and real instance managers as in tests/integration/test_instance_ha.py (its helpers are reused):
the replica reaches the primary through the test's TCP forwarder, which the test cuts as a stopped node would.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kanri.instance.upstream import CONNECT_TIMEOUT_ENV, CONNECTING
from kanri.local.ports import free_port
from tests.forwarder import Forwarder
from tests.integration.test_instance_ha import forwarder, ids, insert, lsn, pair, workspace
from tests.integration.test_instance_manager import PG_BIN, Workspace
from tests.support import eventually

pytestmark = [
    pytest.mark.skipif(not (PG_BIN / "postgres").exists(), reason=f"no PostgreSQL binaries in {PG_BIN}"),
    pytest.mark.timeout(180),
]

__all__ = ["forwarder", "workspace"]  # the fixtures, reused


async def test_a_replica_reports_the_primarys_wal_end_and_keeps_it_after_losing_the_primary(
    workspace: Workspace, forwarder: Forwarder
) -> None:
    async with pair(workspace, forwarder) as (primary, replica):
        await insert(primary, *range(1, 51))
        flushed = lsn((await primary.status())["flushLsn"])

        async def heard_it() -> dict[str, Any] | None:
            upstream = (await replica.status()).get("upstream")
            return upstream if upstream and lsn(upstream["position"]) >= flushed else None

        upstream = await eventually(heard_it, timeout=30)
        assert upstream["timeline"] == 1
        assert upstream["streamingSeconds"] < 3  # it streams: polled every second
        assert (await primary.status()).get("upstream") is None  # a primary reports none

        # The primary's node stops: its connections die and nothing answers there any more.
        last = lsn((await primary.status())["flushLsn"])
        await eventually(lambda: heard_it_at(replica, last), timeout=30)
        forwarder.point(free_port())

        async def lost_it() -> dict[str, Any] | None:
            status = await replica.status()
            upstream = status.get("upstream")
            return status if not status.get("streaming") and upstream and upstream["streamingSeconds"] >= 2 else None

        status = await eventually(lost_it, timeout=60)
        kept = status["upstream"]
        assert lsn(kept["position"]) >= last  # the row vanished; the manager still has what it heard
        assert kept["timeline"] == 1
        assert kept["heardSeconds"] >= kept["streamingSeconds"] >= 2


async def heard_it_at(replica: Any, position: int) -> bool:
    upstream = (await replica.status()).get("upstream") or {}
    return bool(upstream) and lsn(upstream["position"]) >= position


async def test_a_wal_receiver_stuck_on_a_peer_that_never_answers_is_restarted_and_streams_again(
    workspace: Workspace, forwarder: Forwarder
) -> None:
    """A frozen old primary's kernel still accepts the connection and acknowledges the startup packet: the WAL
    receiver waits in ``LibPQWalReceiverConnect`` for as long as it stays frozen. The silent server plays that peer;
    ``-rw`` (the forwarder) then routes to the primary again without ending the hung connection, as kube-proxy
    leaves an established one alone. The manager restarts the receiver, which streams again."""
    held: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never answered

    frozen = await asyncio.start_server(silent, "127.0.0.1", 0)
    frozen_port = frozen.sockets[0].getsockname()[1]
    env = {CONNECT_TIMEOUT_ENV: "3"}
    try:
        async with pair(workspace, forwarder, env=env) as (primary, replica):
            primary_port = forwarder.target
            assert primary_port is not None
            forwarder.point(frozen_port)  # the stream is cut; the receiver's next connection meets the silent peer

            async def waiting() -> bool:
                rows = await replica.query(CONNECTING)
                return bool(rows) and bool(held)

            await eventually(waiting, timeout=30)
            forwarder.target = primary_port  # new connections reach the primary; the hung one stays hung
            await insert(primary, 1)

            async def streams_again() -> dict[str, Any] | None:
                status = await replica.status()
                return status if status.get("streaming") else None

            await eventually(streams_again, timeout=40)
            assert 1 in await ids(replica)
    finally:
        frozen.close()
        for writer in held:
            writer.close()


async def test_a_resumed_replica_tries_its_primary_again_every_second_not_at_wal_retrieve_retry_interval(
    workspace: Workspace, forwarder: Forwarder
) -> None:
    """After a failover the operator resumes the surviving replica towards ``-rw`` before the Service has moved: its
    first connection is refused, and PostgreSQL would wait ``wal_retrieve_retry_interval`` before the next (5 s by
    default; 120 s here, so waiting it out cannot pass). The manager wakes the startup process once a second after
    a resume: once ``-rw`` leads to the primary, the replica streams within seconds."""
    from tests.integration.test_instance_ha import FIRST, SECOND
    from tests.integration.test_instance_manager import BASE_PARAMETERS, chown_tree

    workspace.write_config({**BASE_PARAMETERS, "wal_retrieve_retry_interval": "120s"}, [FIRST, SECOND])
    chown_tree(workspace.root)
    async with pair(workspace, forwarder) as (primary, replica):
        primary_port = forwarder.target
        assert primary_port is not None
        code, paused = await replica.post_json("/replication/pause", workspace.token, {})
        assert code == 200, paused
        forwarder.point(free_port())  # -rw without an endpoint: the resumed receiver's connection is refused
        code, resumed = await replica.post_json("/replication/resume", workspace.token, {})
        assert (code, resumed["resumed"]) == (200, True), resumed

        async def refused_once() -> bool:  # the receiver tried, failed and is gone: PostgreSQL's retry wait runs
            log = "\n".join(p.read_text(errors="replace") for p in (replica.root / "out.log", replica.root / "err.log"))
            return "could not connect to the primary server" in log and not await replica.query(
                "SELECT 1 FROM pg_stat_wal_receiver"
            )

        await eventually(refused_once, timeout=30)
        forwarder.point(primary_port)
        await insert(primary, 7)

        async def streams() -> dict[str, Any] | None:
            status = await replica.status()
            return status if status.get("streaming") else None

        await eventually(streams, timeout=30)  # far below the 120 s PostgreSQL would wait on its own
        assert 7 in await ids(replica)
