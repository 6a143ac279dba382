"""The agent keeps its own pod's role label (the one ``<name>-rw`` selects) equal to what its server reports, so the
Service follows a Sentinel failover while the operator is down. The operator labels pods the same way (both read the
same servers); its pass covers a pod whose agent cannot.

One pod's label it cannot fix itself: an old primary cut off from the network (a partition, a stopped node) still
claims to be primary and cannot reach the API server, and stays in ``-rw`` until its node is marked NotReady (20 s
and more). With the operator up, its pass removes the label of a pod it cannot reach; with the operator down, the
primary that a majority of the Sentinels name (:func:`sole_primary`) removes the ``primary`` label from any other
pod of its cache (the Role allows exactly those pods).

Stdlib only, like :mod:`kanri.cache.agent.resp`: the agent imports neither kanri.runtime nor the operator (import
contract), and the pods run Debian's Python. The API server is reached the in-cluster way: ``KUBERNETES_SERVICE_HOST``
and ``_PORT``, and the token, CA and namespace the StatefulSet mounts (the pod's ServiceAccount may ``get`` and
``patch`` exactly its Cache's pods).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

from kanri.cache.agent.fencing import History

__all__ = ["ApiServer", "LabelError", "PodLabel", "pod_label_from_environment", "role_label", "sole_primary"]

log = structlog.get_logger("kanri.cache.agent")

TOKEN_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
REQUEST_TIMEOUT = 2.0
"""Seconds one API request may take (the role loop never waits for it, but the next label write waits for the one in
flight)."""
VERIFY_EVERY = 5.0
"""Seconds between two reads of the pod's label while the role is unchanged (the operator removes it from a pod it
could not reach; the agent puts it back once its server answers)."""
RETRY_AFTER = 2.0
"""Seconds before the next try after the API server failed or refused."""


def role_label(me: History | None, *, stepping_down: bool = False) -> Literal["primary", "replica"] | None:
    """The role label the pod should carry, from what its own server reports: ``primary`` only for a primary that is
    not stepping down; a fenced server (a replica of nothing) is a replica. None: the server did not answer, the
    label is left as it is (the operator's pass removes it from a pod it cannot reach)."""
    if me is None:
        return None
    return "primary" if me.role == "primary" and not stepping_down else "replica"


def sole_primary(me: str, claims: Sequence[tuple[str, int]], sentinels: int) -> bool:
    """Whether the primary ``me`` may take the ``primary`` label from every other pod: every Sentinel answer of the
    newest configuration epoch names it, and so do a majority of all ``sentinels`` (``claims``: each answering
    Sentinel's primary and epoch). A primary cut off with its own Sentinel never is one."""
    if not claims:
        return False
    newest = max(epoch for _, epoch in claims)
    naming = sum(1 for host, _ in claims if host == me)
    return all(host == me for host, epoch in claims if epoch == newest) and naming > sentinels // 2


class LabelError(Exception):
    """The API server did not answer, or refused (the message has its status and reason, never the token)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ApiServer:
    """The API server, reached with a service-account token re-read on every request (the kubelet rotates it)."""

    host: str
    port: int
    ca_file: Path
    token_file: Path
    timeout: float = REQUEST_TIMEOUT

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None, content_type: str) -> Any:
        payload = None if body is None else json.dumps(body).encode()
        connection: http.client.HTTPSConnection | None = None
        try:  # the CA and token are read here too: a file being rotated is one failed try, not a crash
            context = ssl.create_default_context(cafile=str(self.ca_file))
            headers = {"Authorization": f"Bearer {self.token_file.read_text().strip()}", "Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = content_type
            connection = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=context)
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            text = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise LabelError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        finally:
            if connection is not None:
                connection.close()
        if response.status >= 400:
            raise LabelError(f"{method} {path}: {response.status} {response.reason}", response.status)
        return json.loads(text)

    async def request(self, method: str, path: str, body: Mapping[str, Any] | None = None,
                      content_type: str = "application/merge-patch+json") -> Any:  # fmt: skip
        """One request in a thread (http.client blocks); raises :class:`LabelError`."""
        return await asyncio.to_thread(self._request, method, path, body, content_type)


@dataclass
class PodLabel:
    """One label of one pod, kept at the value :meth:`keep` is called with: written when the value changes, read back
    every :data:`VERIFY_EVERY` s otherwise, and left alone for :data:`RETRY_AFTER` s after a failure."""

    api: ApiServer
    namespace: str
    pod: str
    key: str
    others: tuple[str, ...] = ()
    """The other pods of the cache (a sole primary removes their ``primary`` label)."""
    clock: Callable[[], float] = time.monotonic
    written: str | None = None
    checked_at: float = float("-inf")
    retry_at: float = float("-inf")
    others_checked: bool = False
    seen: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """The pod's metadata at the last GET or PATCH of it (its annotations carry the operator's word to the agent, as
    :mod:`kanri.cache.agent.readable` reads it: no request of its own)."""
    failing: bool = field(default=False, repr=False)
    in_flight: asyncio.Task[None] | None = field(default=None, repr=False)

    def offer(self, value: str, /, *, sole: bool = False) -> None:
        """:meth:`keep` in the background, so the role loop (fencing) never waits for the API server; while one call
        is in flight the offer is dropped (the next round offers again)."""
        if self.in_flight is None or self.in_flight.done():
            self.in_flight = asyncio.create_task(self._keep_logged(value, sole))

    async def _keep_logged(self, value: str, sole: bool) -> None:
        try:
            await self.keep(value, sole=sole)
        except Exception:  # a background task's error would otherwise vanish
            log.exception("could not label the pod")

    def path(self, pod: str | None = None) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{pod or self.pod}"

    def remember(self, answer: Any, pod: str | None = None) -> None:
        """Keep the metadata of this pod from an API answer (another pod's is not this pod's)."""
        if pod in (None, self.pod) and isinstance(answer, dict):
            self.seen = answer.get("metadata") or {}

    async def current(self, pod: str | None = None) -> str | None:
        found = await self.api.request("GET", self.path(pod))
        self.remember(found, pod)
        return ((found.get("metadata") or {}).get("labels") or {}).get(self.key)

    async def patch(self, metadata: Mapping[str, Any], pod: str | None = None) -> None:
        """A merge patch of the pod's metadata; the answer (the pod) is remembered."""
        self.remember(await self.api.request("PATCH", self.path(pod), {"metadata": metadata}), pod)

    async def write(self, value: str | None, pod: str | None = None) -> None:
        await self.patch({"labels": {self.key: value}}, pod)
        log.info("labelled the pod", pod=pod or self.pod, label=self.key, value=value)

    async def clear_others(self) -> None:
        """Remove the ``primary`` label from every other pod that carries it (a pod that is gone is skipped)."""
        for other in self.others:
            try:
                if await self.current(other) == "primary":
                    log.warning("another pod is labelled primary: removing it", pod=other)
                    await self.write(None, other)
            except LabelError as exc:
                if exc.status != 404:
                    raise

    async def keep(self, value: str, *, sole: bool = False) -> None:
        """Make the label ``value``; with ``sole`` (:func:`sole_primary`), also no other pod's ``primary``: as soon as
        it is sole, then at each read-back. Never raises: the label is the Service's hint, never a reason to stop
        keeping the role."""
        now = self.clock()
        if not sole:
            self.others_checked = False  # when it is the sole primary again, the others are looked at again at once
        if now < self.retry_at:
            return
        due = value != self.written or now - self.checked_at >= VERIFY_EVERY
        clear = sole and value == "primary" and (due or not self.others_checked)
        if not (due or clear):
            return
        try:
            if due:
                if value != self.written or await self.current() != value:
                    await self.write(value)
                self.written, self.checked_at, self.others_checked = value, now, False
            if clear:
                await self.clear_others()
                self.others_checked = True
            if self.failing:
                log.info("the API server answers again")
            self.failing = False
        except LabelError as exc:
            self.written, self.retry_at = None, now + RETRY_AFTER
            if not self.failing:  # once per outage: a partitioned pod tries every few seconds
                log.warning("could not label the pod", label=self.key, value=value, error=str(exc))
            self.failing = True


def pod_label_from_environment(environ: Mapping[str, str] | None = None, root: Path = TOKEN_DIR) -> PodLabel | None:
    """The pod's role label, from the environment the StatefulSet sets (``CACHE_ROLE_LABEL``, ``POD_NAME``,
    ``POD_NAMESPACE``, ``CACHE_NAME``, ``CACHE_REPLICAS``) and the mounted token; None outside a pod or without a
    token (the operator labels alone)."""
    env = os.environ if environ is None else environ
    host, port, key = (
        env.get("KUBERNETES_SERVICE_HOST"),
        env.get("KUBERNETES_SERVICE_PORT"),
        env.get("CACHE_ROLE_LABEL"),
    )
    pod, namespace = env.get("POD_NAME"), env.get("POD_NAMESPACE")
    token, ca = root / "token", root / "ca.crt"
    if not (host and port and key and pod and namespace and token.is_file() and ca.is_file()):
        log.warning("no API access: the operator alone labels this pod")
        return None
    cache, count = env.get("CACHE_NAME", ""), int(env.get("CACHE_REPLICAS") or 0)
    others = tuple(name for name in (f"{cache}-{index}" for index in range(count)) if name != pod)
    return PodLabel(ApiServer(host.strip("[]"), int(port), ca, token), namespace, pod, key, others)
