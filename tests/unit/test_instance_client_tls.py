"""The operator's instance client refuses an instance API that cannot prove it belongs to the cluster.

A real HTTPS server (aiohttp, on 127.0.0.1) stands in for an instance manager's API on port 8008; its certificate
is made the way kanri makes them (``kanri.postgres.tls.certificates``). The client, told to trust the cluster's CA for
``<cluster>-rw`` (as ``ensure_tls`` tells it), must talk to a server whose certificate that CA signed, and must refuse
one signed by another CA, one that does not name ``<cluster>-rw``, and plain HTTP — before it sends anything, so
the bearer token never reaches an impostor.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.tls import certificates as tls

NOW = dt.datetime.now(dt.UTC)
CLUSTER, NAMESPACE = "orders", "shop"
TOKEN = "bearer-token-for-the-test"
STATUS = {"name": "orders-1", "role": "primary", "ready": True, "running": True, "timeline": 1}


@pytest.fixture(scope="module")
def cluster_ca() -> tls.Issued:
    return tls.build_ca(CLUSTER, NAMESPACE, NOW)


def server_certificate(ca: tls.Issued, dns: list[str] | None = None) -> tls.Issued:
    names = tls.dns_names(CLUSTER, NAMESPACE, ["orders-1"]) if dns is None else dns
    return tls.build_server(ca, "orders-1", names, NOW)


@asynccontextmanager
async def instance_api(tmp_path: Path, served: tls.Issued | None) -> AsyncIterator[tuple[int, list[str]]]:
    """An HTTPS server with ``served`` (plain HTTP when None) answering /status and any action; yields its port and
    the Authorization headers it received."""
    seen: list[str] = []

    async def status(request: web.Request) -> web.Response:
        return web.json_response(STATUS)

    async def action(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/status", status)
    app.router.add_post("/{action}", action)
    context: ssl.SSLContext | None = None
    if served is not None:
        (tmp_path / "tls.crt").write_bytes(served.cert)
        (tmp_path / "tls.key").write_bytes(served.key)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # a free port, known before the site starts
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.SockSite(runner, sock, ssl_context=context).start()
        yield sock.getsockname()[1], seen
    finally:
        await runner.cleanup()


@asynccontextmanager
async def trusting(port: int, ca: tls.Issued) -> AsyncIterator[HttpInstanceClient]:
    """The operator's client, trusting ``ca`` for 127.0.0.1 under the name every instance certificate carries."""
    client = HttpInstanceClient(port=port, timeout=5.0)
    client.trust(f"{NAMESPACE}/{CLUSTER}", ["127.0.0.1"], ca.cert, f"{CLUSTER}-rw")
    try:
        yield client
    finally:
        await client.close()


async def test_a_certificate_signed_by_the_clusters_ca_is_accepted(cluster_ca: tls.Issued, tmp_path: Path) -> None:
    async with instance_api(tmp_path, server_certificate(cluster_ca)) as (port, seen), trusting(port, cluster_ca) as c:
        report = await c.status("127.0.0.1")
        assert report is not None
        assert (report.name, report.role) == ("orders-1", "primary")
        assert await c.restart("127.0.0.1", TOKEN)
    assert seen == [f"Bearer {TOKEN}"]


@pytest.mark.parametrize(
    "impostor",
    [
        # the same names, from a CA the operator never trusted (another cluster's, or an attacker's)
        pytest.param(lambda ca: server_certificate(tls.build_ca(CLUSTER, NAMESPACE, NOW)), id="another-ca"),
        # the right CA, but not a certificate for this cluster's instances
        pytest.param(lambda ca: server_certificate(ca, ["billing-rw", "billing-1-0"]), id="wrong-name"),
        pytest.param(lambda ca: None, id="plain-http"),
    ],
)
async def test_an_instance_api_the_ca_does_not_vouch_for_is_refused_before_the_token_is_sent(
    cluster_ca: tls.Issued, tmp_path: Path, impostor: Callable[[tls.Issued], tls.Issued | None]
) -> None:
    async with instance_api(tmp_path, impostor(cluster_ca)) as (port, seen), trusting(port, cluster_ca) as c:
        assert await c.status("127.0.0.1") is None
        assert not await c.restart("127.0.0.1", TOKEN)
        assert not await c.fence("127.0.0.1", TOKEN, "test")
    assert seen == []  # no request got through: the token never left the operator
