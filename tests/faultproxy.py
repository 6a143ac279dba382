"""A fault-injecting loopback proxy between a kanri ``Client`` and the real API server, for tests.

The client speaks plain HTTP to ``127.0.0.1:<port>``; the proxy forwards every request over TLS with the admin
kubeconfig's client certificate, passing watch streams through line by line. Rules added at run time make chosen
requests fail instead, the ways a real API path fails: an error status (429 with ``Retry-After``, 500, 503), a
request held unanswered (the client times out), a write whose response is lost after the server applied it, a watch
cut mid-stream, a watch answered with 410 Gone, a watch that stays open and says nothing. Every request is logged
with what the client got and what the API server answered, so a test can count writes.

    async with FaultProxy(kubeconfig) as proxy:
        client = proxy.client()
        proxy.fail(429, method="PATCH", path=r"/configmaps/", times=3, retry_after=1)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import ssl
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import yaml
from aiohttp import web

from kanri.runtime import Client
from kanri.runtime._connection import Connection

Action = Literal["status", "hang", "cut", "gone", "silent"]

_REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}
# The headers worth passing on. Accept-Encoding is not: the proxy must read watch lines, so it asks for identity.
_REQUEST_HEADERS = ("Accept", "Content-Type", "User-Agent")
_RESPONSE_HEADERS = ("Content-Type", "Retry-After", "Audit-Id")


@dataclass
class Rule:
    """One fault, applied to the next ``times`` requests that match (forever when ``times`` is None)."""

    action: Action
    method: str | None = None
    path: re.Pattern[str] | None = None
    watch: bool | None = None
    times: int | None = 1
    status: int = 500
    retry_after: float | None = None
    after_forward: bool = False
    seconds: float | None = None
    events: int | None = None
    hits: int = 0
    """How many requests this rule has caught so far (a test can wait for a fault to have happened)."""

    def matches(self, method: str, path: str, watch: bool) -> bool:
        return (
            (self.times is None or self.hits < self.times)
            and (self.method is None or self.method == method)
            and (self.watch is None or self.watch == watch)
            and (self.path is None or self.path.search(path) is not None)
        )

    @property
    def spent(self) -> bool:
        return self.times is not None and self.hits >= self.times


@dataclass
class Record:
    """One request the client made: what it asked, what it got, and what the API server itself answered."""

    method: str
    path: str
    query: dict[str, str]
    watch: bool
    at: float
    """When it arrived (event-loop time)."""
    fault: Action | None = None
    status: int | None = None
    """What the client got (None: the connection was dropped before an answer)."""
    forwarded: bool = False
    """Sent on to the API server (which may have acted on it even when its answer never came back)."""
    upstream_status: int | None = None
    """What the API server answered (None: not forwarded, or no answer yet)."""


@dataclass
class _Watch:
    request: web.BaseRequest
    path: str


@dataclass
class FaultProxy:
    """The proxy for the API server of ``kubeconfig`` (the admin kubeconfig a local control plane writes)."""

    kubeconfig: Path
    log: list[Record] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    port: int = 0
    _upstream: str = ""
    _session: aiohttp.ClientSession | None = None
    _runner: web.ServerRunner | None = None
    _watches: list[_Watch] = field(default_factory=list)
    _pending: set[asyncio.Future[Any]] = field(default_factory=set)

    # --- lifetime --------------------------------------------------------------------------------------------------

    async def start(self) -> FaultProxy:
        self._upstream, context = _tls_from_kubeconfig(self.kubeconfig)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )
        # handler_cancellation: when the client gives up on a held or streaming request, its handler stops too.
        self._runner = web.ServerRunner(web.Server(self._handle, handler_cancellation=True), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await asyncio.gather(*self._pending, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> Client:
        """A kanri Client that reaches the API server through this proxy."""
        return Client(Connection(self.url), **kwargs)

    # --- faults ----------------------------------------------------------------------------------------------------

    def fail(
        self,
        status: int,
        *,
        method: str | None = None,
        path: str | None = None,
        watch: bool | None = None,
        times: int | None = 1,
        retry_after: float | None = None,
        after_forward: bool = False,
    ) -> Rule:
        """Answer with ``status`` instead. ``after_forward``: the API server gets (and applies) the request first and
        only its response is replaced — the write happened, the client cannot know it did."""
        return self._add(
            Rule("status", method, _regex(path), watch, times, status, retry_after, after_forward=after_forward)
        )

    def hang(
        self,
        *,
        seconds: float | None = None,
        method: str | None = None,
        path: str | None = None,
        watch: bool | None = None,
        times: int | None = 1,
    ) -> Rule:
        """Hold the request unanswered: for ``seconds`` and then forward it, or (None) until the client gives up."""
        return self._add(Rule("hang", method, _regex(path), watch, times, seconds=seconds))

    def cut_watch(
        self,
        *,
        after_events: int | None = None,
        after_seconds: float | None = None,
        path: str | None = None,
        times: int | None = 1,
    ) -> Rule:
        """Forward a watch, then drop the connection (no clean end of stream) after some events or seconds."""
        return self._add(Rule("cut", "GET", _regex(path), True, times, seconds=after_seconds, events=after_events))

    def expire_watch(self, *, path: str | None = None, times: int | None = 1) -> Rule:
        """Answer a watch as the API server does when its resourceVersion was compacted: a 410 ERROR event."""
        return self._add(Rule("gone", "GET", _regex(path), True, times))

    def silence_watch(self, *, path: str | None = None, times: int | None = 1) -> Rule:
        """Accept a watch and then say nothing at all (no events, no bookmarks) until the client gives up."""
        return self._add(Rule("silent", "GET", _regex(path), True, times))

    def drop_watches(self, path: str | None = None) -> int:
        """Drop every watch stream open now (whose path matches); returns how many."""
        pattern = _regex(path)
        dropped = 0
        for watch in list(self._watches):
            if pattern is None or pattern.search(watch.path):
                _abort(watch.request)
                dropped += 1
        return dropped

    def clear(self) -> None:
        """Remove every rule (requests in flight keep the fault they already got)."""
        self.rules.clear()

    def _add(self, rule: Rule) -> Rule:
        self.rules.append(rule)
        return rule

    def _take(self, method: str, path: str, watch: bool) -> Rule | None:
        for rule in self.rules:
            if rule.matches(method, path, watch):
                rule.hits += 1
                return rule
        return None

    # --- what happened ---------------------------------------------------------------------------------------------

    def requests(
        self, method: str | None = None, path: str | None = None, *, watch: bool | None = None
    ) -> list[Record]:
        pattern = _regex(path)
        return [
            r
            for r in self.log
            if (method is None or r.method == method)
            and (watch is None or r.watch == watch)
            and (pattern is None or pattern.search(r.path))
        ]

    # --- serving ---------------------------------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        watch = request.query.get("watch") in ("1", "true")
        record = Record(request.method, request.path, dict(request.query), watch, asyncio.get_running_loop().time())
        self.log.append(record)
        body = await request.read()
        rule = self._take(request.method, request.path, watch)
        if rule is not None:
            record.fault = rule.action
        if rule is None or rule.action == "cut":
            return await self._forward(request, body, record, rule)
        if rule.action == "status":
            if rule.after_forward:
                await self._exchange(request, body, record)
            return _status_response(record, rule.status, rule.retry_after)
        if rule.action == "hang":
            if rule.seconds is None:
                await asyncio.Event().wait()  # until the client disconnects and the handler is cancelled
            else:
                await asyncio.sleep(rule.seconds)
            return await self._forward(request, body, record, None)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        record.status = 200
        await response.prepare(request)
        if rule.action == "gone":
            await response.write(json.dumps(_GONE).encode() + b"\n")
            await response.write_eof()
            return response
        await asyncio.Event().wait()  # silent: an open stream that never says anything
        raise AssertionError("unreachable")

    async def _forward(
        self, request: web.BaseRequest, body: bytes, record: Record, rule: Rule | None
    ) -> web.StreamResponse:
        if not record.watch:
            status, headers, payload = await self._exchange(request, body, record)
            record.status = status
            return web.Response(status=status, body=payload, headers=headers)
        async with self._send(request, body, record) as upstream:
            headers = _response_headers(upstream)
            if upstream.status != 200:
                record.status = upstream.status
                return web.Response(status=upstream.status, body=await upstream.read(), headers=headers)
            response = web.StreamResponse(status=200, headers=headers)
            record.status = 200
            await response.prepare(request)
            await self._stream(request, upstream, response, rule)
            return response

    async def _exchange(
        self, request: web.BaseRequest, body: bytes, record: Record
    ) -> tuple[int, dict[str, str], bytes]:
        """Forward a request and read the whole answer. Once sent, the exchange runs to its end (and is recorded)
        even if the client gives up meanwhile — as it does in the API server."""

        async def round_trip() -> tuple[int, dict[str, str], bytes]:
            async with self._send(request, body, record) as upstream:
                return upstream.status, _response_headers(upstream), await upstream.read()

        task = asyncio.ensure_future(round_trip())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return await asyncio.shield(task)

    @contextlib.asynccontextmanager
    async def _send(
        self, request: web.BaseRequest, body: bytes, record: Record
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        assert self._session is not None
        headers = {name: request.headers[name] for name in _REQUEST_HEADERS if name in request.headers}
        headers["Accept-Encoding"] = "identity"
        url = self._upstream + request.path_qs
        record.forwarded = True
        async with self._session.request(request.method, url, data=body or None, headers=headers) as upstream:
            record.upstream_status = upstream.status
            yield upstream

    async def _stream(
        self,
        request: web.BaseRequest,
        upstream: aiohttp.ClientResponse,
        response: web.StreamResponse,
        rule: Rule | None,
    ) -> None:
        """Pass a watch through line by line; a ``cut`` rule drops the connection after its events or seconds."""
        watch = _Watch(request, request.path)
        self._watches.append(watch)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + rule.seconds if rule is not None and rule.seconds is not None else None
        events = 0
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        line = await upstream.content.readline()
                except TimeoutError:
                    _abort(request)
                    return
                if not line:
                    await response.write_eof()
                    return
                await response.write(line)
                events += bool(line.strip())
                if rule is not None and rule.events is not None and events >= rule.events:
                    _abort(request)
                    return
        finally:
            self._watches.remove(watch)


_GONE = {
    "type": "ERROR",
    "object": {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "reason": "Expired",
        "code": 410,
        "message": "too old resource version (injected by faultproxy)",
    },
}


def _response_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return {name: upstream.headers[name] for name in _RESPONSE_HEADERS if name in upstream.headers}


def _status_response(record: Record, status: int, retry_after: float | None) -> web.Response:
    record.status = status
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "reason": _REASONS.get(status, "InternalError"),
        "code": status,
        "message": f"{status} injected by faultproxy",
    }
    headers = {"Content-Type": "application/json"}
    if retry_after is not None:
        headers["Retry-After"] = f"{retry_after:g}"
    return web.Response(status=status, text=json.dumps(body), headers=headers)


def _abort(request: web.BaseRequest) -> None:
    """Drop the client's connection without ending the response: what a dying load balancer or server does."""
    if request.transport is not None:
        request.transport.abort()


def _regex(pattern: str | None) -> re.Pattern[str] | None:
    return re.compile(pattern) if pattern is not None else None


def _tls_from_kubeconfig(path: Path) -> tuple[str, ssl.SSLContext]:
    """The server URL of the kubeconfig's current context and a TLS context with its CA and client certificate."""
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    current = config.get("current-context")
    context = _named(config, "contexts", current) if current else config["contexts"][0]["context"]
    cluster = _named(config, "clusters", context["cluster"])
    user = _named(config, "users", context["user"])
    with tempfile.TemporaryDirectory() as tmp:

        def pem(data_key: str, file_key: str, entry: dict[str, Any], name: str) -> str:
            if data_key in entry:
                target = Path(tmp) / name
                target.write_bytes(base64.b64decode(entry[data_key]))
                return str(target)
            return str(path.parent / entry[file_key])

        tls = ssl.create_default_context(
            cafile=pem("certificate-authority-data", "certificate-authority", cluster, "ca")
        )
        tls.load_cert_chain(
            pem("client-certificate-data", "client-certificate", user, "crt"),
            pem("client-key-data", "client-key", user, "key"),
        )
    return str(cluster["server"]).rstrip("/"), tls


def _named(config: dict[str, Any], section: str, name: str) -> dict[str, Any]:
    """The entry called ``name`` in a kubeconfig section (``clusters`` holds ``cluster`` entries, and so on)."""
    entry = next(item for item in config[section] if item.get("name") == name)
    inner: dict[str, Any] = entry[section.removesuffix("s")]
    return inner
