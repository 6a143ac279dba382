"""Talking to in-pod agents (instance managers, brokers' sidecars): the operator's HTTP client.

An agent's state is not a Kubernetes object, so a pass asks every agent directly — all at once, within a deadline
(:func:`gather`) — and requeues itself to ask again. What every operator needs for that:

- a **pod-IP directory** (:func:`pod_addresses`): the owner's pods from the cache, by the operator's labels, skipping
  pods being deleted and pods without an IP;
- a **token from a Secret** (:func:`secret_token`), sent as a bearer header only and never logged;
- **per-owner TLS trust** (:meth:`AgentClient.trust`): the owner's pods are spoken to in HTTPS, verified against that
  owner's CA for one server name every pod's certificate carries (pods are reached by IP); another owner's CA never
  verifies them, and an address no owner trusts is plain HTTP;
- answers that are data, never exceptions (:class:`AgentAnswer`): an agent that does not answer is a fact of the
  pass, not an error of the reconcile.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import structlog

from kanri.kit._labels import LabelSet
from kanri.runtime import Cache
from kanri.runtime.kinds import POD, SECRET

__all__ = ["AgentAnswer", "AgentClient", "gather", "pod_addresses", "secret_token"]

Obj = dict[str, Any]
T = TypeVar("T")
log = structlog.get_logger("kanri.kit.agents")


@dataclass(frozen=True)
class AgentAnswer:
    """An agent's answer: the HTTP status (0: no answer at all), its JSON body, and an error text when not 2xx."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def pod_addresses(cache: Cache, labels: LabelSet, owner: Obj, *, name_label: str | None = None) -> dict[str, str]:
    """The owner's running pods' IPs by pod name (or by the value of ``labels.key(name_label)``), from the cache."""
    meta = owner["metadata"]
    found: dict[str, str] = {}
    for pod in cache.list(POD, meta.get("namespace"), labels.selector(meta["name"])):
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or pod["metadata"].get("deletionTimestamp"):
            continue
        key = pod["metadata"]["name"]
        if name_label is not None:
            key = (pod["metadata"].get("labels") or {}).get(labels.key(name_label)) or key
        found[key] = str(ip)
    return found


def secret_token(cache: Cache, namespace: str, name: str, key: str = "token") -> str | None:
    """The text under ``key`` of the Secret ``name`` in the cache; None when missing, empty or not valid base64."""
    secret = cache.get(SECRET, name, namespace)
    raw = ((secret or {}).get("data") or {}).get(key)
    if not raw:
        return None
    try:
        value = base64.b64decode(str(raw), validate=True).decode().strip()
    except (binascii.Error, ValueError):
        return None
    return value or None


async def gather(calls: Mapping[str, Callable[[], Awaitable[T | None]]], *, timeout: float) -> dict[str, T]:
    """Run every call at once; the answers that came within ``timeout`` seconds and were not None, by key. A call
    that fails or is late is left out (the pass asks again next time)."""

    async def one(key: str, call: Callable[[], Awaitable[T | None]]) -> tuple[str, T | None]:
        try:
            async with asyncio.timeout(timeout):
                return key, await call()
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            log.debug("agent call failed", agent=key, error=type(exc).__name__)
            return key, None

    answers = await asyncio.gather(*(one(key, call) for key, call in calls.items()))
    return {key: value for key, value in answers if value is not None}


class AgentClient:
    """HTTP(S) to agents at ``<scheme>://<pod IP>:<port>``; ``timeout`` bounds each request (a pass must not wait on a
    hung agent). One session for every owner; TLS per owner (:meth:`trust`)."""

    def __init__(self, *, port: int, timeout: float = 2.0) -> None:
        self.port = port
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._owners: dict[str, tuple[frozenset[str], bytes, ssl.SSLContext, str]] = {}
        self._trusted: dict[str, tuple[ssl.SSLContext, str]] = {}

    def trust(self, owner: str, addresses: Iterable[str], ca_pem: bytes | None, server_name: str = "") -> None:
        """Speak HTTPS to ``addresses`` (the owner's pods; the set replaces the previous one), verifying the
        certificate against ``ca_pem`` for ``server_name``. ``ca_pem`` None forgets the owner (its pods are then
        spoken to in plain HTTP). ``owner`` is any stable key: ``namespace/name`` or the uid."""
        if ca_pem is None:
            self._owners.pop(owner, None)
        else:
            known = self._owners.get(owner)
            context = known[2] if known is not None and known[1] == ca_pem else ssl.create_default_context(
                cadata=ca_pem.decode())  # fmt: skip
            self._owners[owner] = (frozenset(addresses), ca_pem, context, server_name)
        self._trusted = {a: (c, n) for pods, _, c, n in self._owners.values() for a in pods}

    def forget(self, owner: str) -> None:
        """Drop an owner that is gone (its CA and addresses)."""
        self.trust(owner, (), None)

    def url(self, address: str, path: str) -> str:
        host = f"[{address}]" if ":" in address else address
        scheme = "https" if address in self._trusted else "http"
        return f"{scheme}://{host}:{self.port}{path}"

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        address: str,
        path: str,
        *,
        token: str | None = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> AgentAnswer:
        """One request; the answer, or ``AgentAnswer(0, error=...)`` when none came (refused, timed out, not JSON)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        options: dict[str, Any] = {}
        if timeout is not None:
            options["timeout"] = aiohttp.ClientTimeout(total=timeout)
        if (trusted := self._trusted.get(address)) is not None:
            options |= {"ssl": trusted[0], "server_hostname": trusted[1] or None}
        try:
            async with self._http().request(method, self.url(address, path), headers=headers, json=body,
                                            **options) as response:  # fmt: skip
                answer = await response.json(content_type=None) if response.content_length != 0 else {}
                answer = answer if isinstance(answer, dict) else {}
                error = None if 200 <= response.status < 300 else str(answer.get("error") or response.reason)[:300]
                if response.status in (401, 403):  # alive, but refusing the token: no network fault, say so
                    log.warning("agent refused the token", address=address, path=path, status=response.status)
                return AgentAnswer(response.status, answer, error)
        except (aiohttp.ClientError, TimeoutError, ValueError, ssl.SSLError) as exc:
            log.debug("agent request failed", address=address, path=path, error=type(exc).__name__)
            return AgentAnswer(0, {}, f"no answer ({type(exc).__name__})")

    async def get(self, address: str, path: str, *, token: str | None = None, timeout: float | None = None
                  ) -> AgentAnswer:  # fmt: skip
        return await self.request("GET", address, path, token=token, timeout=timeout)

    async def post(self, address: str, path: str, *, token: str | None = None, body: Any = None,
                   timeout: float | None = None) -> AgentAnswer:  # fmt: skip
        return await self.request("POST", address, path, token=token, body=body, timeout=timeout)
