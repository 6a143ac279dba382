"""Partition reassignment over Kafka's own protocol: AlterPartitionReassignments (API key 45) and
ListPartitionReassignments (API key 46), version 0 of each.

confluent-kafka 2.16.1 (librdkafka 2.16) has no call for either, and the broker jars ``make kafka-dist`` fetches
carry no ``kafka-reassign-partitions`` tool, so the two requests are written here: one short-lived connection per
call to a bootstrap broker, which forwards them to the active KRaft controller. Both versions are "flexible"
(compact strings and arrays, tagged fields), with request header v2 and response header v1.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kanri.kafka.topics.admin import AdminError

ALTER_REASSIGNMENTS = 45
LIST_REASSIGNMENTS = 46
CLIENT_ID = b"kanri-kafka-operator"
#: Kafka's error codes the reassignment answers use (the rest are reported by number).
ERRORS = {0: "NONE", 3: "UNKNOWN_TOPIC_OR_PART", 7: "REQUEST_TIMED_OUT", 39: "INVALID_REPLICA_ASSIGNMENT",
          41: "NOT_CONTROLLER", 60: "REASSIGNMENT_IN_PROGRESS", 85: "NO_REASSIGNMENT_IN_PROGRESS"}  # fmt: skip
_RETRIABLE = {7, 41}
_correlation = itertools.count(1)


@dataclass(frozen=True)
class Ongoing:
    """One partition being moved, as the controller reports it."""

    partition: int
    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


# --- encoding ------------------------------------------------------------------------------------------------------


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _compact_string(text: str) -> bytes:
    raw = text.encode()
    return _uvarint(len(raw) + 1) + raw


def _compact_int32s(values: Sequence[int]) -> bytes:
    return _uvarint(len(values) + 1) + b"".join(struct.pack(">i", v) for v in values)


_NO_TAGS = b"\x00"


def _request(api_key: int, correlation: int, body: bytes, version: int = 0) -> bytes:
    header = struct.pack(">hhi", api_key, version, correlation)
    frame = header + struct.pack(">h", len(CLIENT_ID)) + CLIENT_ID + _NO_TAGS + body
    return struct.pack(">i", len(frame)) + frame


def alter_body(topic: str, assignment: Mapping[int, Sequence[int]], timeout_ms: int) -> bytes:
    """AlterPartitionReassignmentsRequest v0: move each partition of ``topic`` to its replicas (leader first)."""
    partitions = b"".join(struct.pack(">i", p) + _compact_int32s(replicas) + _NO_TAGS
                          for p, replicas in sorted(assignment.items()))  # fmt: skip
    topics = _uvarint(2) + _compact_string(topic) + _uvarint(len(assignment) + 1) + partitions + _NO_TAGS
    return struct.pack(">i", timeout_ms) + topics + _NO_TAGS


def list_body(topic: str | None, partitions: Sequence[int], timeout_ms: int) -> bytes:
    """ListPartitionReassignmentsRequest v0 for these partitions of ``topic``; every partition being moved in the
    cluster when ``topic`` is None (a null topics array)."""
    if topic is None:
        return struct.pack(">i", timeout_ms) + _uvarint(0) + _NO_TAGS
    topics = _uvarint(2) + _compact_string(topic) + _compact_int32s(partitions) + _NO_TAGS
    return struct.pack(">i", timeout_ms) + topics + _NO_TAGS


# --- decoding ------------------------------------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    def string(self) -> str | None:
        length = self.uvarint() - 1
        if length < 0:
            return None
        text = self.data[self.pos : self.pos + length].decode()
        self.pos += length
        return text

    def int32s(self) -> tuple[int, ...]:
        return tuple(self.take(">i") for _ in range(max(0, self.uvarint() - 1)))

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


def _error(code: int, message: str | None) -> AdminError:
    name = ERRORS.get(code, f"KAFKA_ERROR_{code}")
    return AdminError(name, message or name, code in _RETRIABLE)


def parse_alter(payload: bytes) -> dict[int, AdminError]:
    """AlterPartitionReassignmentsResponse v0 -> the partitions Kafka refused, with why (a top-level error
    raises)."""
    reader = _Reader(payload)
    reader.take(">i")  # throttle time
    code, message = reader.take(">h"), reader.string()
    if code:
        raise _error(code, message)
    refused: dict[int, AdminError] = {}
    for _ in range(reader.uvarint() - 1):
        reader.string()
        for _ in range(reader.uvarint() - 1):
            partition, code, message = reader.take(">i"), reader.take(">h"), reader.string()
            reader.tags()
            if code:
                refused[partition] = _error(code, message)
        reader.tags()
    return refused


def parse_list_all(payload: bytes) -> dict[tuple[str, int], Ongoing]:
    """ListPartitionReassignmentsResponse v0 -> the partitions being moved now, by (topic, partition)."""
    reader = _Reader(payload)
    reader.take(">i")
    code, message = reader.take(">h"), reader.string()
    if code:
        raise _error(code, message)
    ongoing: dict[tuple[str, int], Ongoing] = {}
    for _ in range(reader.uvarint() - 1):
        topic = reader.string() or ""
        for _ in range(reader.uvarint() - 1):
            partition = reader.take(">i")
            replicas, adding, removing = reader.int32s(), reader.int32s(), reader.int32s()
            reader.tags()
            ongoing[(topic, partition)] = Ongoing(partition, replicas, adding, removing)
        reader.tags()
    return ongoing


def parse_list(payload: bytes) -> dict[int, Ongoing]:
    """ListPartitionReassignmentsResponse v0 for one topic -> its partitions being moved now."""
    return {partition: found for (_, partition), found in parse_list_all(payload).items()}


# --- the calls -----------------------------------------------------------------------------------------------------


async def _call(bootstrap: str, api_key: int, body: bytes, timeout: float, version: int = 0) -> bytes:
    """Send one request (``api_key`` at ``version``, request header v2, response header v1) to the first bootstrap
    broker that answers (each forwards to the active controller); the response body."""
    failures = []
    for address in [part.strip() for part in bootstrap.split(",") if part.strip()]:
        try:
            return await _call_one(address, api_key, body, timeout, version)
        except AdminError as exc:
            if exc.code != "_TRANSPORT":
                raise
            failures.append(exc.message)
    raise AdminError("_TRANSPORT", "; ".join(failures) or f"no address in {bootstrap!r}", True)


async def _call_one(address: str, api_key: int, body: bytes, timeout: float, version: int) -> bytes:
    host, _, port = address.rpartition(":")
    correlation = next(_correlation) & 0x7FFFFFFF
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
            try:
                writer.write(_request(api_key, correlation, body, version))
                await writer.drain()
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(size)
            finally:
                writer.close()
    except TimeoutError:
        raise AdminError("_TIMED_OUT", f"{address}: no answer within {timeout} s", True) from None
    except (OSError, asyncio.IncompleteReadError) as exc:
        raise AdminError("_TRANSPORT", f"{address}: {exc}", True) from None
    if struct.unpack_from(">i", frame)[0] != correlation:
        raise AdminError("_BAD_MSG", "answer to another request", True)
    header = _Reader(frame)
    header.pos = 4
    header.tags()  # response header v1
    return frame[header.pos :]


async def alter(
    bootstrap: str, topic: str, assignment: Mapping[int, Sequence[int]], timeout: float = 15.0
) -> dict[int, AdminError]:
    """Ask Kafka to move each partition to its replicas; returns the partitions it refused."""
    body = alter_body(topic, assignment, int(timeout * 1000))
    return parse_alter(await _call(bootstrap, ALTER_REASSIGNMENTS, body, timeout))


async def ongoing(bootstrap: str, topic: str, partitions: Sequence[int], timeout: float = 15.0) -> dict[int, Ongoing]:
    """The partitions of ``topic`` Kafka is moving now."""
    body = list_body(topic, partitions, int(timeout * 1000))
    return parse_list(await _call(bootstrap, LIST_REASSIGNMENTS, body, timeout))


async def ongoing_all(bootstrap: str, timeout: float = 15.0) -> dict[tuple[str, int], Ongoing]:
    """Every partition of the cluster Kafka is moving now."""
    body = list_body(None, (), int(timeout * 1000))
    return parse_list_all(await _call(bootstrap, LIST_REASSIGNMENTS, body, timeout))
