"""The operator's status reads carry the cluster's API token (``GET /status`` refuses anyone without it, issue 33):
against the instance manager's real HTTP app, over a plain-HTTP socket on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from kanri.instance.http_api import build_app
from kanri.postgres.cluster.instances import HttpInstanceClient, gather_reports
from tests.unit.test_instance_http_api import FakeBackend

STATUS = {"name": "orders-1", "role": "primary", "ready": True, "running": True, "timeline": 1}


class Backend(FakeBackend):
    async def status(self) -> dict[str, Any]:
        return dict(STATUS)


@asynccontextmanager
async def instance_api(token: str) -> AsyncIterator[int]:
    backend = Backend()
    backend.token = token
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    runner = web.AppRunner(build_app(backend))
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        yield sock.getsockname()[1]
    finally:
        await runner.cleanup()


async def test_gather_reports_sends_the_token_and_a_later_probe_reuses_it() -> None:
    async with asyncio.timeout(10), instance_api("the-token") as port:
        client = HttpInstanceClient(port=port, timeout=5.0, plain=True)
        try:
            assert await client.status("127.0.0.1") is None, "no token: refused (401), read as no report"
            assert await gather_reports(client, {"orders-1": "127.0.0.1"}, "wrong") == {}
            reports = await gather_reports(client, {"orders-1": "127.0.0.1"}, "the-token")
            assert reports["orders-1"].name == "orders-1"
            # failover's probes during a demotion name no token: the one last used with the address goes
            report = await client.status("127.0.0.1", timeout=2.0)
            assert report is not None
            assert report.role == "primary"
        finally:
            await client.close()
