"""A minimal Valkey client (RESP2 over asyncio streams) for the handful of commands the agent and the operator send:
``AUTH``, ``INFO``, ``REPLICAOF``, ``SENTINEL``. Standard library only: the pods' interpreter (and the operator's
image) need no client library, and valkey-py 6.2 does not import on Python 3.11.2 without ``async_timeout``."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["UNAVAILABLE", "Connection", "ReplyError", "Secret", "parse_info"]


class Secret:
    """A password that never shows in a repr, a log line or a traceback's locals; its text goes only on the wire."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "Secret(<hidden>)"

    __str__ = __repr__


class ReplyError(Exception):
    """The server answered with an error (``-ERR ...``, ``-NOGOODSLAVE ...``)."""


UNAVAILABLE: tuple[type[BaseException], ...] = (ReplyError, OSError, TimeoutError, asyncio.IncompleteReadError)
"""What a command to a server that is down, starting, fenced or refusing may raise."""


def _encode(args: tuple[str | int | Secret, ...]) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = (arg.value if isinstance(arg, Secret) else str(arg)).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class Connection:
    """One connection; every call is bounded by ``timeout`` seconds."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float) -> None:
        self._reader, self._writer, self._timeout = reader, writer, timeout

    @classmethod
    async def open(cls, host: str, port: int, password: Secret | None, timeout: float = 1.0) -> Connection:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
        connection = cls(reader, writer, timeout)
        if password:
            try:
                await connection.command("AUTH", password)
            except BaseException:
                await connection.close()
                raise
        return connection

    async def command(self, *args: str | int | Secret) -> Any:
        """Send one command and read its reply (bytes decoded as UTF-8); an error reply raises ReplyError."""
        async with asyncio.timeout(self._timeout):
            self._writer.write(_encode(args))
            await self._writer.drain()
            return await self._read()

    async def _read(self) -> Any:
        line = (await self._reader.readuntil(b"\r\n"))[:-2]
        kind, rest = line[:1], line[1:].decode()
        if kind == b"+":
            return rest
        if kind == b"-":
            raise ReplyError(rest)
        if kind == b":":
            return int(rest)
        if kind == b"$":
            if int(rest) < 0:
                return None
            return (await self._reader.readexactly(int(rest) + 2))[:-2].decode()
        if kind == b"*":
            return None if int(rest) < 0 else [await self._read() for _ in range(int(rest))]
        raise ReplyError(f"unexpected reply type {kind!r}")

    async def info(self, section: str) -> dict[str, Any]:
        return parse_info(await self.command("INFO", section))

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


def parse_info(text: str) -> dict[str, Any]:
    """``INFO``'s text as a dict of strings; ``db0:keys=1,expires=0`` and ``slave0:ip=...`` become dicts."""
    parsed: dict[str, Any] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or ":" not in line:
            continue
        key, value = line.split(":", 1)
        if "=" in value and (key.startswith("db") or key.startswith("slave")):
            parsed[key] = dict(item.split("=", 1) for item in value.split(",") if "=" in item)
        else:
            parsed[key] = value
    return parsed
