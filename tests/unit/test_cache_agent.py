"""The in-pod agent's pure parts: the runtime files it writes and the RESP2 client's parsing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kanri.cache.agent.node import FENCED_PRIMARY, Node, runtime_config, sentinel_file, split
from kanri.cache.agent.resp import Connection, ReplyError, Secret, parse_info
from kanri.cache.agent.sources import LOCKED, REPLICATION_USER, source_password

NODE = Node("orders", "orders-1.orders-hl.ns.svc.cluster.local:6379", ("orders-0.orders-hl:6379",),
            ("orders-0.orders-hl:26379",), Secret("s3cret"))  # fmt: skip


def test_a_server_always_starts_fenced_with_its_password_and_announced_name() -> None:
    text = runtime_config("port 6379\ndir /data\nappendonly yes\n", NODE, data_dir=Path("/tmp/x"))
    lines = text.splitlines()
    assert f"replicaof {FENCED_PRIMARY}" in lines
    assert "requirepass s3cret" in lines
    assert "s3cret" not in "".join(line for line in lines if line.startswith(("masterauth", "user")))
    assert f"masterauth {LOCKED}" in lines  # no source until the agent checked one
    assert f"masteruser {REPLICATION_USER}" in lines
    own = source_password(Secret("s3cret"), NODE.me).value
    assert f"user {REPLICATION_USER} on >{own} -@all +ping +replconf +psync +sync" in lines
    assert "replica-announce-ip orders-1.orders-hl.ns.svc.cluster.local" in lines
    assert "dir /data" not in lines  # Valkey changes into dir as it reads it: the override replaces the line
    assert "dir /tmp/x" in lines


def test_the_sentinel_file_monitors_the_given_primary() -> None:
    template = "sentinel monitor orders {primary} 2\n"
    text = sentinel_file(template, NODE, "orders-0.orders-hl:6379")
    assert "sentinel monitor orders orders-0.orders-hl 6379 2" in text
    assert "sentinel auth-pass orders s3cret" in text
    assert "sentinel announce-ip orders-1.orders-hl.ns.svc.cluster.local" in text


def test_addresses_split_at_the_last_colon() -> None:
    assert split("a.b.c:6379") == ("a.b.c", 6379)


def test_info_text_becomes_a_dict() -> None:
    text = "# Replication\r\nrole:slave\r\nmaster_host:h\r\nslave0:ip=1.2.3.4,port=6379,offset=5\r\n"
    text += "db0:keys=3,expires=0\r\n"
    info = parse_info(text)
    assert info["role"] == "slave"
    assert info["slave0"]["offset"] == "5"
    assert info["db0"] == {"keys": "3", "expires": "0"}


async def reply(data: bytes) -> object:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()

    class Sink:
        def write(self, _: bytes) -> None: ...

        async def drain(self) -> None: ...

    connection = Connection(reader, Sink(), timeout=1.0)  # type: ignore[arg-type]
    return await connection.command("PING")


async def test_replies_of_every_resp2_type_are_read() -> None:
    assert await reply(b"+OK\r\n") == "OK"
    assert await reply(b":42\r\n") == 42
    assert await reply(b"$5\r\nhello\r\n") == "hello"
    assert await reply(b"$-1\r\n") is None
    assert await reply(b"*2\r\n$1\r\na\r\n:1\r\n") == ["a", 1]


async def test_an_error_reply_raises() -> None:
    with pytest.raises(ReplyError, match="NOGOODSLAVE"):
        await reply(b"-NOGOODSLAVE No suitable replica to promote\r\n")


def test_the_password_never_shows_in_a_repr() -> None:
    assert "s3cret" not in repr(NODE)
    assert "s3cret" not in str(Secret("s3cret"))
