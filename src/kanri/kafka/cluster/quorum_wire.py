"""The KRaft controller quorum as the active controller reports it: DescribeQuorum (API key 55), version 1.

confluent-kafka 2.16.1 (librdkafka 2.16) has no call for it (``kafka-metadata-quorum``'s Java ``Admin`` call is
not in librdkafka), so the request is written here the way :mod:`kanri.kafka.topics.reassign_wire` writes the
reassignment requests: one short connection to a bootstrap broker, which forwards it to the active controller.
Version 1 is flexible (compact strings and arrays, tagged fields; request header v2, response header v1) and, unlike
v0, reports each voter's last fetch and last caught-up time on the leader's clock. The response has no throttle
time: its body starts with the error code.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# the flexible-format reader, encoders and the one-connection call are the reassignment module's: one
# implementation of the wire format
from kanri.kafka.topics import reassign_wire
from kanri.kafka.topics.admin import AdminError
from kanri.kafka.topics.reassign_wire import _NO_TAGS, ERRORS, _call, _compact_string, _Reader, _uvarint

DESCRIBE_QUORUM = 55
VERSION = 1
METADATA_TOPIC = "__cluster_metadata"


@dataclass(frozen=True)
class Replica:
    """One voter (or observer) of the metadata log, as the leader sees it."""

    node_id: int
    log_end_offset: int
    """-1 when the leader does not know it."""
    last_fetch_ms: int
    """The leader's wall clock at the replica's last fetch; -1 for the leader itself or when unknown."""
    last_caught_up_ms: int
    """The leader's wall clock when the replica last fetched up to the leader's end; the leader reports now for
    itself, -1 when unknown."""


@dataclass(frozen=True)
class QuorumState:
    leader_id: int
    """-1 while no leader is elected."""
    leader_epoch: int
    high_watermark: int
    voters: tuple[Replica, ...]
    observers: tuple[Replica, ...]


def describe_body() -> bytes:
    """DescribeQuorumRequest v1: partition 0 of the metadata log (the only one)."""
    partitions = _uvarint(2) + struct.pack(">i", 0) + _NO_TAGS
    return _uvarint(2) + _compact_string(METADATA_TOPIC) + partitions + _NO_TAGS + _NO_TAGS


def _request(correlation: int, body: bytes) -> bytes:
    """The whole request frame, as :func:`describe` sends it."""
    return reassign_wire._request(DESCRIBE_QUORUM, correlation, body, VERSION)


def _replicas(reader: _Reader) -> tuple[Replica, ...]:
    found = []
    for _ in range(reader.uvarint() - 1):
        node, end = reader.take(">i"), reader.take(">q")
        fetched, caught_up = reader.take(">q"), reader.take(">q")
        reader.tags()
        found.append(Replica(node, end, fetched, caught_up))
    return tuple(found)


def _error(code: int) -> AdminError:
    name = ERRORS.get(code, f"KAFKA_ERROR_{code}")
    return AdminError(name, f"DescribeQuorum: {name}", code in (7, 41))


def parse_describe(payload: bytes) -> QuorumState:
    """DescribeQuorumResponse v1 (after the response header) -> the metadata log's quorum; an error raises."""
    reader = _Reader(payload)
    if code := reader.take(">h"):
        raise _error(code)
    found: QuorumState | None = None
    for _ in range(reader.uvarint() - 1):
        reader.string()
        for _ in range(reader.uvarint() - 1):
            reader.take(">i")
            if code := reader.take(">h"):
                raise _error(code)
            leader, epoch, high = reader.take(">i"), reader.take(">i"), reader.take(">q")
            voters, observers = _replicas(reader), _replicas(reader)
            reader.tags()
            found = QuorumState(leader, epoch, high, voters, observers)
        reader.tags()
    if found is None:
        raise AdminError("_BAD_MSG", "DescribeQuorum answered without the metadata partition", True)
    return found


async def describe(bootstrap: str, timeout: float = 10.0) -> QuorumState:
    """The quorum from the first bootstrap broker that answers."""
    return parse_describe(await _call(bootstrap, DESCRIBE_QUORUM, describe_body(), timeout, VERSION))
