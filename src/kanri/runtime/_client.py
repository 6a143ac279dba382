"""The API client: raw JSON dicts for objects (deserialising into generated models is the main CPU cost of a Python
operator at scale) over one aiohttp session the client owns.

What it adds over the bare transport: a client-side QPS/burst limiter, 429 ``Retry-After`` honoured, retries of
idempotent requests on transient failures, server-side apply, ``/status`` writes, paginated lists, raw watches, and
``rest_client_requests_total`` so request counts can be asserted (e.g. zero writes on a converged object).

The session is built from a :class:`Connection` resolved once (kanri.runtime._connection): no netrc or proxy lookup
per request, no thread per request, and kubernetes_asyncio (with its generated models) is not imported at all unless
the kubeconfig needs an exec plugin or an auth provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit

import aiohttp
import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram

from kanri.runtime._connection import ConfigError, Connection, in_cluster, load_kubeconfig, load_with_kubernetes_asyncio
from kanri.runtime._errors import ApiError
from kanri.runtime._kinds import Kind, name_of, namespace_of
from kanri.runtime._ratelimit import TokenBucket

Obj = dict[str, Any]
WriteListener = Callable[[Kind, Obj], None]
# A JSON patch is a list of operations; merge patches and objects are dicts.
Body = Obj | list[Obj]


@dataclass(frozen=True, slots=True)
class Write:
    """One successful write made during a reconcile: what a controller needs to recognise the watch event that
    reports it (kanri.runtime._echo)."""

    kind: Kind
    namespace: str
    name: str
    uid: str
    resource_version: str
    """The version the server returned: the object as this write left it."""
    sent: bytes
    """The body as sent (an object, a merge patch or an apply configuration), JSON-encoded: immutable, and decoded
    only when an event has to be checked against it."""
    manager: str
    """The field manager the server records in ``managedFields`` for this write."""
    operation: str
    """``Apply`` or ``Update``, as in ``managedFields``."""
    subresource: str | None = None


# Set by a controller around each reconcile: every write the reconcile makes is appended (see Controller).
recorded_writes: contextvars.ContextVar[list[Write] | None] = contextvars.ContextVar("kanri_writes", default=None)

_IDEMPOTENT = frozenset({"GET", "HEAD"})
_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=10)
_STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10)  # watches: the inactivity timeout bounds them
_MAX_RETRY_AFTER = 30.0


def _connection_failed(exc: BaseException, method: str, path: str) -> ApiError:
    """The API server could not be reached (or did not answer in time), as a 503 the callers classify as transient."""
    message = str(exc) or type(exc).__name__
    return ApiError(503, {"reason": "ConnectionFailed", "message": message}, method=method, path=path)


@contextlib.contextmanager
def _connection_errors(method: str, path: str) -> Iterator[None]:
    """A connection lost while reading a body (a watch cut mid-stream) is a 503 like one lost before the headers."""
    try:
        yield
    except aiohttp.ClientError as exc:
        raise _connection_failed(exc, method, path) from exc


class RequestLimiter(Protocol):
    """Anything that hands out request slots: ``reserve()`` returns how long to wait for this one."""

    def reserve(self) -> float: ...


class Unlimited:
    """A limiter that never waits (for benchmarks measuring the API server's own limit)."""

    def reserve(self) -> float:
        return 0.0


@dataclass(frozen=True)
class RetryPolicy:
    """How many times, and how patiently, a failed request is tried again."""

    attempts: int = 6
    base_delay: float = 0.1
    max_delay: float = 5.0

    def delay(self, attempt: int) -> float:
        # Full jitter keeps a crowd of clients from retrying in lockstep after an API-server blip.
        return random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))


class ClientMetrics:
    """controller-runtime's client metric names, on an injected registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            ["code", "method", "host"],
            registry=registry,
        )
        self.latency = Histogram(
            "rest_client_request_duration_seconds",
            "Request latency in seconds, by verb and host.",
            ["verb", "host"],
            registry=registry,
        )


class Client:
    """An asynchronous Kubernetes client working on raw JSON dicts.

    Build it with :meth:`from_kubeconfig`, :meth:`in_cluster` or :meth:`auto`; close it with :meth:`close` (or use
    ``async with``).
    """

    def __init__(
        self,
        connection: Connection,
        *,
        rate_limiter: RequestLimiter | None = None,
        retry: RetryPolicy | None = None,
        metrics: ClientMetrics | None = None,
        user_agent: str = "kanri",
        max_connections: int = 100,
    ) -> None:
        self._connection = connection
        self._host = connection.host.rstrip("/")
        self._host_label = urlsplit(self._host).netloc
        # controller-runtime's client default (client-go's own is 5 qps / burst 10, too low for an operator).
        self._limiter = rate_limiter if rate_limiter is not None else TokenBucket(rate=20.0, burst=30)
        self._retry = retry or RetryPolicy()
        self._metrics = metrics
        self._user_agent = user_agent
        # The manager name the API server derives from the User-Agent for writes that do not name one.
        self._default_manager = user_agent.split("/", 1)[0][:128]
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._write_listeners: list[WriteListener] = []
        self._counters: dict[tuple[str, str], Any] = {}
        self._histograms: dict[str, Any] = {}

    @classmethod
    async def from_kubeconfig(cls, path: str | None = None, context: str | None = None, **kwargs: Any) -> Client:
        """A client from a kubeconfig file (``$KUBECONFIG`` or ``~/.kube/config`` when ``path`` is None)."""
        connection = load_kubeconfig(path, context)
        if connection is None:  # an exec plugin or auth provider: kubernetes_asyncio knows those
            connection = await load_with_kubernetes_asyncio(path, context)
        return cls(connection, **kwargs)

    @classmethod
    def in_cluster(cls, **kwargs: Any) -> Client:
        """A client from the pod's service-account token (re-read every minute, as the kubelet rotates it)."""
        return cls(in_cluster(), **kwargs)

    @classmethod
    async def auto(cls, kubeconfig: str | None = None, **kwargs: Any) -> Client:
        """In-cluster when running in a pod and no kubeconfig is given, else from the kubeconfig."""
        if kubeconfig is None:
            try:
                return cls.in_cluster(**kwargs)
            except ConfigError:
                pass
        return await cls.from_kubeconfig(kubeconfig, **kwargs)

    def _open(self) -> aiohttp.ClientSession:
        # Created on first use: an aiohttp session belongs to the running event loop.
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, ssl=self._connection.ssl_context or True, enable_cleanup_closed=True
            )
            # trust_env=False: the proxy was resolved once (Connection.proxy); with True, aiohttp reads netrc and
            # proxy settings in a thread for every request. Watch events of large objects need a big read buffer
            # (etcd allows 1.5 MiB objects).
            # No cookie jar: the API server sets none, and aiohttp filters the jar on every request.
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, read_bufsize=2**21, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def host(self) -> str:
        return self._host

    def add_write_listener(self, listener: WriteListener) -> None:
        """Call ``listener(kind, obj)`` with the object each successful write (create, replace, patch, apply) returns
        (a copy of its own, which it may keep).

        The Manager's cache listens, so a reconcile that runs before the watch event of its own earlier write
        arrives sees that write instead of the state before it (and does not write the same thing again).
        """
        self._write_listeners.append(listener)

    def _written(
        self,
        kind: Kind,
        raw: bytes,
        sent: bytes | None,
        *,
        manager: str | None = None,
        operation: str = "Update",
        subresource: str | None = None,
    ) -> Obj:
        obj: Obj = orjson.loads(raw) if raw else {}
        if obj.get("kind") == kind.kind:  # the object itself: not a Status, nor another subresource's type (Scale)
            for listener in self._write_listeners:
                # Each listener gets its own copy: decoding again is far cheaper than copy.deepcopy.
                listener(kind, orjson.loads(raw))
            if (writes := recorded_writes.get()) is not None and sent is not None:
                meta = obj.get("metadata") or {}
                writes.append(
                    Write(
                        kind=kind,
                        namespace=str(meta.get("namespace") or ""),
                        name=str(meta.get("name") or ""),
                        uid=str(meta.get("uid") or ""),
                        resource_version=str(meta.get("resourceVersion") or ""),
                        sent=sent,
                        manager=manager or self._default_manager,
                        operation=operation,
                        subresource=subresource,
                    )
                )
        return obj

    # --- reads -----------------------------------------------------------------------------------------------------

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        return await self._json("GET", kind.path(namespace, name))

    async def get_path(self, path: str) -> Obj:
        """GET any API path as JSON (``/version``, ``/openapi/v3/api/v1``, ``/apis``)."""
        return await self._json("GET", path)

    async def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[list[Obj], str]:
        """Every object (paginated with ``limit``/``continue``) and the list's resourceVersion."""
        items: list[Obj] = []
        query: dict[str, str] = {"limit": str(page_size)}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        while True:
            page = await self._json("GET", kind.path(namespace), query=query)
            for item in page.get("items", []):
                # List items omit apiVersion/kind; put them back so cached objects are self-describing.
                item.setdefault("apiVersion", kind.api_version)
                item.setdefault("kind", kind.kind)
                items.append(item)
            token = page.get("metadata", {}).get("continue")
            if not token:
                return items, str(page.get("metadata", {}).get("resourceVersion", ""))
            query["continue"] = token

    async def watch(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        inactivity_timeout: float = 90.0,
        label_selector: str | None = None,
    ) -> AsyncIterator[Obj]:
        """Watch events (dicts with ``type`` and ``object``) from ``resource_version``, bookmarks on.

        Ends when the server closes the stream (after ``timeout_seconds``). Raises :class:`ApiError` (410 when the
        version is too old) or ``TimeoutError`` when nothing, not even a bookmark, arrived for
        ``inactivity_timeout`` seconds — a stream gone silent is treated as dead, never trusted.
        """
        query = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        if label_selector:
            query["labelSelector"] = label_selector
        path = kind.path(namespace)
        # The wait for the response headers counts as inactivity too: a proxy can accept and then never answer.
        async with asyncio.timeout(inactivity_timeout):
            response = await self._request("GET", path, query=query, stream=True)
        # Read whatever has arrived and split it into lines ourselves: under load one read holds many events, and
        # a readline() per event costs an await, a timeout and aiohttp's line search each.
        pending: list[bytes] = []  # the start of a line still incomplete (a big object spans many reads)
        try:
            while True:
                with _connection_errors("WATCH", path):
                    async with asyncio.timeout(inactivity_timeout):
                        chunk = await response.content.readany()
                if not chunk:
                    return  # the server ended the watch (a line cut off by the end of the stream is dropped)
                pending.append(chunk)
                if b"\n" not in chunk:
                    continue
                *lines, rest = b"".join(pending).split(b"\n")
                pending = [rest] if rest else []
                for line in lines:
                    if not line.strip():
                        continue
                    event: Obj = orjson.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object", {})
                        raise ApiError(int(status.get("code", 500)), status, method="WATCH", path=path)
                    yield event
        finally:
            response.release()

    # --- writes ----------------------------------------------------------------------------------------------------

    async def create(self, kind: Kind, obj: Obj) -> Obj:
        """POST a new object (``apiVersion``/``kind`` filled in from ``kind`` when missing)."""
        data = orjson.dumps({"apiVersion": kind.api_version, "kind": kind.kind, **obj})
        return self._written(kind, await self._raw("POST", kind.path(namespace_of(obj) or None), body=data), data)

    async def create_subresource(
        self, kind: Kind, name: str, subresource: str, body: Obj, namespace: str | None = None
    ) -> Obj:
        """POST to a subresource of an existing object, e.g. a Pod's ``binding`` or ``eviction``, or a
        ServiceAccount's ``token``; ``body`` is the subresource's own object (a Binding, an Eviction, ...)."""
        return await self._json("POST", kind.path(namespace, name, subresource), body=body)

    async def replace(self, kind: Kind, obj: Obj) -> Obj:
        """PUT the whole object; guarded by its ``metadata.resourceVersion`` (409 when stale)."""
        data = orjson.dumps({"apiVersion": kind.api_version, "kind": kind.kind, **obj})
        path = kind.path(namespace_of(obj) or None, name_of(obj))
        return self._written(kind, await self._raw("PUT", path, body=data), data)

    async def replace_status(self, kind: Kind, obj: Obj) -> Obj:
        """PUT to ``/status``: only the status changes; guarded by ``metadata.resourceVersion``."""
        data = orjson.dumps(obj)
        path = kind.path(namespace_of(obj) or None, name_of(obj), "status")
        return self._written(kind, await self._raw("PUT", path, body=data), data, subresource="status")

    async def patch(
        self,
        kind: Kind,
        name: str,
        patch: Body,
        namespace: str | None = None,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> Obj:
        """PATCH with ``patch_type`` one of ``merge``, ``json``, ``strategic``.

        ``field_manager`` names the writer in ``managedFields`` (default: derived from the User-Agent by the server).
        """
        content_type = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }[patch_type]
        data = orjson.dumps(patch)
        path = kind.path(namespace, name, subresource)
        query = {"fieldManager": field_manager} if field_manager else None
        result = await self._raw("PATCH", path, body=data, query=query, content_type=content_type)
        # A JSON patch names operations, not the fields' new values: it is never taken for "only our write".
        sent = data if patch_type != "json" else None
        return self._written(kind, result, sent, manager=field_manager, subresource=subresource)

    async def patch_status(
        self, kind: Kind, name: str, patch: Obj, namespace: str | None = None, *, field_manager: str | None = None
    ) -> Obj:
        """A merge patch of the ``status`` subresource (see :meth:`patch`)."""
        return await self.patch(kind, name, patch, namespace, subresource="status", field_manager=field_manager)

    async def apply(
        self, kind: Kind, obj: Obj, *, field_manager: str, force: bool = True, subresource: str | None = None
    ) -> Obj:
        """Server-side apply: ``obj`` states every field this manager owns; the server merges and tracks ownership.

        Safe to retry (applying the same intent twice is the same as once).
        """
        data = orjson.dumps({"apiVersion": kind.api_version, "kind": kind.kind, **obj})
        query = {"fieldManager": field_manager, "force": "true" if force else "false"}
        path = kind.path(namespace_of(obj) or None, name_of(obj), subresource)
        result = await self._raw(
            "PATCH", path, body=data, query=query, content_type="application/apply-patch+yaml", idempotent=True
        )
        return self._written(kind, result, data, manager=field_manager, operation="Apply", subresource=subresource)

    async def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> Obj | None:
        """Delete; returns the object (still present while finalizers run) or None when it was already gone.

        ``uid`` / ``resource_version`` preconditions make sure the object deleted is the one the caller saw.
        ``grace_period_seconds`` overrides the object's grace period (0: remove now — what a kubelet sends once a
        pod's processes are gone).
        """
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation_policy:
            body["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            body["preconditions"] = preconditions
        try:
            result = await self._json("DELETE", kind.path(namespace, name), body=body)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
        return result if result.get("kind") != "Status" else None

    # --- transport -------------------------------------------------------------------------------------------------

    async def _json(
        self,
        method: str,
        path: str,
        *,
        body: Body | bytes | None = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        idempotent: bool | None = None,
    ) -> Obj:
        raw = await self._raw(method, path, body=body, query=query, content_type=content_type, idempotent=idempotent)
        result: Obj = orjson.loads(raw) if raw else {}
        return result

    async def _raw(
        self,
        method: str,
        path: str,
        *,
        body: Body | bytes | None = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        idempotent: bool | None = None,
    ) -> bytes:
        response = await self._request(
            method, path, body=body, query=query, content_type=content_type, idempotent=idempotent
        )
        try:
            with _connection_errors(method, path):
                return await response.read()
        finally:
            response.release()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Body | bytes | None = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        idempotent: bool | None = None,
        stream: bool = False,
    ) -> aiohttp.ClientResponse:
        """One logical request: rate-limited, retried when that is safe, counted. Raises :class:`ApiError`."""
        retry_safe = method in _IDEMPOTENT if idempotent is None else idempotent
        url = self._host + path + ("?" + urlencode(query) if query else "")
        data = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
        session = self._session or self._open()
        attempt = 0
        while True:
            if (wait := self._limiter.reserve()) > 0:
                await asyncio.sleep(wait)
            headers = await self._headers(content_type if data is not None else None)
            started = time.monotonic()
            try:
                response = await session.request(
                    method,
                    url,
                    data=data,
                    headers=headers,
                    timeout=_STREAM_TIMEOUT if stream else _REQUEST_TIMEOUT,
                    server_hostname=self._connection.server_hostname,
                    proxy=self._connection.proxy,
                )
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                self._count("<error>", method)
                if retry_safe and attempt + 1 < self._retry.attempts:
                    await asyncio.sleep(self._retry.delay(attempt))
                    attempt += 1
                    continue
                raise _connection_failed(exc, method, path) from exc
            if self._metrics is not None:
                self._count(str(response.status), method)
                self._observe(method, time.monotonic() - started)
            if response.status < 300:
                return response
            raw = await response.read()
            response.release()
            error = ApiError.from_bytes(response.status, raw, method=method, path=path)
            # 429 means the request was not processed (priority and fairness rejected it): retrying is always safe.
            if attempt + 1 < self._retry.attempts and (response.status == 429 or (retry_safe and error.transient)):
                await asyncio.sleep(self._retry_after(response) or self._retry.delay(attempt))
                attempt += 1
                continue
            raise error

    async def _headers(self, content_type: str | None) -> dict[str, str]:
        """One attempt's headers: the credentials' current Authorization, and ``content_type`` when there is a body."""
        headers = {"Accept": "application/json", "User-Agent": self._user_agent}
        if (authorization := await self._connection.credentials.authorization()) is not None:
            headers["Authorization"] = authorization
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    def _count(self, code: str, method: str) -> None:
        if self._metrics is None:
            return
        # A labelled child per (code, method), looked up once: prometheus_client's labels() takes a lock and
        # builds a tuple on every call.
        counter = self._counters.get((code, method))
        if counter is None:
            counter = self._counters[code, method] = self._metrics.requests.labels(code, method, self._host_label)
        counter.inc()

    def _observe(self, method: str, seconds: float) -> None:
        assert self._metrics is not None
        histogram = self._histograms.get(method)
        if histogram is None:
            histogram = self._histograms[method] = self._metrics.latency.labels(method, self._host_label)
        histogram.observe(seconds)

    @staticmethod
    def _retry_after(response: aiohttp.ClientResponse) -> float | None:
        value = response.headers.get("Retry-After")
        if value is None:
            return None
        try:
            return min(max(float(value), 0.0), _MAX_RETRY_AFTER)
        except ValueError:
            return None
