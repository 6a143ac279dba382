"""kanri.kit agent client against real HTTP(S) servers on localhost: token, per-owner TLS trust, gather deadline."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kanri.kit import AgentClient, gather

SERVER_NAME = "agents.example"
NAME = web.AppKey("name", str)
RELEASE = web.AppKey("release", asyncio.Event)


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def make_ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("ca")).issuer_name(_name("ca")).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))  # fmt: skip
    return key, cert


def server_files(tmp_path: Path, ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate]) -> ssl.SSLContext:
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    names = x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (x509.CertificateBuilder().subject_name(_name("agent")).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(names, critical=False).sign(ca_key, hashes.SHA256()))  # fmt: skip
    (tmp_path / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    return context


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


async def status(request: web.Request) -> web.Response:
    if request.headers.get("Authorization") != "Bearer s3cret":
        return web.json_response({"error": "unauthorized"}, status=401)
    return web.json_response({"name": request.app[NAME]})


async def slow(request: web.Request) -> web.Response:
    await request.app[RELEASE].wait()  # answers only when the test is over
    return web.json_response({})


@pytest_asyncio.fixture(loop_scope="session")
async def agent(tmp_path: Path) -> AsyncIterator[tuple[int, int, x509.Certificate]]:
    """A plain and an HTTPS agent on 127.0.0.1 (ports), and the CA of the HTTPS one."""
    ca = make_ca()
    release = asyncio.Event()
    runners = []
    ports = []
    for name, context in (("plain", None), ("tls", server_files(tmp_path, ca))):
        app = web.Application()
        app[NAME] = name
        app[RELEASE] = release
        app.router.add_get("/status", status)
        app.router.add_get("/slow", slow)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        runners.append(runner)
        ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    yield ports[0], ports[1], ca[1]
    release.set()
    for runner in runners:
        await runner.cleanup()


async def test_the_token_goes_as_a_bearer_header(agent: tuple[int, int, x509.Certificate]) -> None:
    client = AgentClient(port=agent[0])
    try:
        assert (await client.get("127.0.0.1", "/status", token="s3cret")).body == {"name": "plain"}
        refused = await client.get("127.0.0.1", "/status", token="wrong")
        assert (refused.status, refused.ok, refused.error) == (401, False, "unauthorized")
    finally:
        await client.close()


async def test_an_owners_pods_are_verified_against_that_owners_ca(agent: tuple[int, int, x509.Certificate]) -> None:
    client = AgentClient(port=agent[1])
    try:
        client.trust("ns/a", ["127.0.0.1"], pem(agent[2]), SERVER_NAME)
        answer = await client.get("127.0.0.1", "/status", token="s3cret")
        assert answer.body == {"name": "tls"}
        assert client.url("127.0.0.1", "/x").startswith("https://")
        # another owner's CA does not verify them
        client.trust("ns/a", ["127.0.0.1"], pem(make_ca()[1]), SERVER_NAME)
        assert (await client.get("127.0.0.1", "/status", token="s3cret")).status == 0
        # forgotten: plain HTTP, which a TLS server does not answer with data
        client.forget("ns/a")
        assert client.url("127.0.0.1", "/x").startswith("http://")
        assert not (await client.get("127.0.0.1", "/status", token="s3cret")).ok
    finally:
        await client.close()


async def test_gather_keeps_the_answers_that_came_within_the_deadline(
    agent: tuple[int, int, x509.Certificate],
) -> None:
    client = AgentClient(port=agent[0], timeout=60)
    try:

        async def ask(path: str) -> str | None:
            answer = await client.get("127.0.0.1", path, token="s3cret")
            return str(answer.body.get("name")) if answer.ok else None

        started = asyncio.get_running_loop().time()
        found = await gather({"fast": lambda: ask("/status"), "slow": lambda: ask("/slow"),
                              "refused": lambda: ask("/missing")}, timeout=1.0)  # fmt: skip
        assert found == {"fast": "plain"}
        assert asyncio.get_running_loop().time() - started < 10  # bounded by the deadline, not by the slow agent
    finally:
        await client.close()
