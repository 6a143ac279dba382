"""A TCP forwarder on 127.0.0.1 standing in for a Service in front of PostgreSQL: each new connection goes to the
port it points at when the connection arrives. ``point(port)`` moves it and, by default, cuts the connections to
the old target (a Service's endpoint change leaving a dead peer behind); ``cut=False`` keeps them, as a proxy's
rules do for connections made before they changed (conntrack). ``hold(port)`` cuts a target off without closing
anything: what arrives for it, on open connections or new ones, is read and dropped, and nothing comes back (a
server whose traffic is blackholed, as seen by a peer whose kernel still acknowledges: the forwarder's own)."""

from __future__ import annotations

import asyncio
import contextlib

from kanri.local.ports import free_port

__all__ = ["Forwarder"]


class Forwarder:
    """Start it with :meth:`start`, move it with :meth:`point`, stop it with :meth:`close`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.target: int | None = None
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self.held: set[int] = set()

    async def start(self, target: int) -> None:
        self.target = target
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    def point(self, target: int, *, cut: bool = True) -> None:
        self.target = target
        if cut:
            for writer in list(self._open):
                writer.close()

    def hold(self, target: int) -> None:
        """Drop everything to and from ``target`` from now on, keeping its connections open; :meth:`release` ends it."""
        self.held.add(target)

    def release(self, target: int) -> None:
        self.held.discard(target)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.point(0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = self.target
        if target in self.held:  # a new connection to a cut-off server: nothing ever answers
            self._open.add(writer)
            try:
                with contextlib.suppress(OSError):
                    while await reader.read(65536):
                        pass
                writer.close()
            finally:
                self._open.discard(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        self._open |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    if target in self.held:
                        continue
                    dst.write(data)
                    await dst.drain()
            dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._open -= {writer, up_writer}
