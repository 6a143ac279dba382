"""A hostile "S3" server a tenant could name as its repository endpoint (issue 33), served by the test process on
127.0.0.1: it pages forever, streams a body without end, or never answers (or, ``empty``, answers honestly that it
holds nothing); it counts every request it gets."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

from aiohttp import web

Mode = Literal["pages", "huge", "silent", "empty"]
NS = "http://s3.amazonaws.com/doc/2006-03-01/"


@dataclass
class HostileS3:
    """What the server does (``mode``), what it was asked (``requests``: method and path), where it listens."""

    mode: Mode = "pages"
    requests: list[tuple[str, str]] = field(default_factory=list)
    endpoint: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if self.mode == "silent":
            await asyncio.Event().wait()  # never answers (cancelled when the client goes)
        if self.mode == "huge":
            response = web.StreamResponse(headers={"Content-Type": "application/xml"})
            await response.prepare(request)
            chunk = b"<Key>" + b"x" * 65536 + b"</Key>"
            with contextlib.suppress(ConnectionError):
                for _ in range(16 * 1024):  # 1 GiB if nobody stops reading
                    await response.write(chunk)
            return response
        if self.mode == "empty":  # an honest store holding nothing under the prefix
            empty = f'<ListBucketResult xmlns="{NS}"><IsTruncated>false</IsTruncated></ListBucketResult>'
            return web.Response(body=empty.encode(), content_type="application/xml")
        # pages: always "more", always a fresh token, one key a page
        page = len(self.requests)
        body = (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="{NS}"><IsTruncated>true'
                f"</IsTruncated><Contents><Key>k/{page}</Key></Contents><NextContinuationToken>"
                f"{secrets.token_hex(8)}</NextContinuationToken></ListBucketResult>")  # fmt: skip
        return web.Response(body=body.encode(), content_type="application/xml")


@contextlib.asynccontextmanager
async def hostile_s3(mode: Mode = "pages") -> AsyncIterator[HostileS3]:
    """The server, listening on a free port of 127.0.0.1 (``server.endpoint``)."""
    server = HostileS3(mode)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.endpoint = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        await runner.cleanup()
