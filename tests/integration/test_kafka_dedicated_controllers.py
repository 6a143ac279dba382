"""Dedicated KRaft controllers (kanri.kafka.broker with ``KAFKA_PROCESS_ROLES=controller``) on real host processes:
three controller-only nodes (ids 1000-1002) hold the quorum, three broker-only nodes register with it, a topic of
replication factor 3 takes acks=all writes that read back, and DescribeQuorum (kanri's wire code) names exactly the
three controllers as voters and none of the brokers — so a broker's load or loss never touches the quorum."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kanri.kafka.cluster import quorum_wire
from kanri.kafka.topics.admin import TopicAdmin
from tests.integration.test_kafka_scaling import MESSAGES, consume_all, produce
from tests.kafka_host import host_cluster


async def test_three_dedicated_controllers_hold_the_quorum_for_three_broker_only_nodes(tmp_path: Path) -> None:
    with host_cluster(tmp_path, 3, dedicated=3) as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        admin = TopicAdmin(bootstrap)
        try:
            assert await admin.broker_ids() == [0, 1, 2]
            await admin.create("orders", 6, 3, {"min.insync.replicas": "2"})
            acked = await asyncio.to_thread(produce, bootstrap, "orders")
            assert len(acked) == MESSAGES
            assert await asyncio.to_thread(consume_all, bootstrap, "orders", 6) == acked
            quorum = await quorum_wire.describe(bootstrap, 10.0)
            assert sorted(v.node_id for v in quorum.voters) == [1000, 1001, 1002]
            assert quorum.leader_id in (1000, 1001, 1002)
            assert {o.node_id for o in quorum.observers} >= {0, 1, 2}  # the brokers follow the log, never vote
            properties = (tmp_path / "controller0" / "config" / "server.properties").read_text()
            assert "process.roles=controller\n" in properties
            assert "listeners=CONTROLLER://127.0.1.1:" in properties
        finally:
            admin.close()
