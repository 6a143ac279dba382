"""Talking to the instance managers: ``GET /status``, ``POST /restart``, ``POST /promote`` on port 8008.

The instance's state is not a Kubernetes object, so the controller cannot watch it: the reconciler asks every
instance on each pass (all at once, with a short timeout) and requeues itself periodically. :class:`InstanceClient`
is a Protocol so tests (and other transports) can stand in; :class:`HttpInstanceClient` is the real one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import structlog

__all__ = ["HttpInstanceClient", "InstanceClient", "InstanceReport", "gather_reports", "parse_report"]

log = structlog.get_logger("kanri.postgres.instances")


@dataclass(frozen=True)
class InstanceReport:
    """What one instance manager says about itself (``GET /status``)."""

    name: str
    role: str
    """``primary`` or ``replica``."""
    ready: bool
    running: bool
    timeline: int | None = None
    write_lsn: str | None = None
    receive_lsn: str | None = None
    replay_lsn: str | None = None
    lag_bytes: int | None = None
    pending_restart: bool = False
    last_error: str | None = None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def parse_report(body: Any) -> InstanceReport | None:
    """An :class:`InstanceReport` from the JSON body, or None when it is not one (a wrong answer is no answer)."""
    if not isinstance(body, dict) or body.get("role") not in ("primary", "replica") or not _str(body.get("name")):
        return None
    return InstanceReport(
        name=str(body["name"]),
        role=str(body["role"]),
        ready=body.get("ready") is True,
        running=body.get("running") is True,
        timeline=_int(body.get("timeline")),
        write_lsn=_str(body.get("writeLsn")),
        receive_lsn=_str(body.get("receiveLsn")),
        replay_lsn=_str(body.get("replayLsn")),
        lag_bytes=_int(body.get("lagBytes")),
        pending_restart=body.get("pendingRestart") is True,
        last_error=_str(body.get("lastError")),
    )


class InstanceClient(Protocol):
    """The operator's view of the instance managers' API."""

    async def status(self, address: str) -> InstanceReport | None:
        """The instance's report, or None when it cannot be reached or answers nonsense."""
        ...

    async def restart(self, address: str, token: str) -> bool:
        """Ask the instance to restart PostgreSQL; True when it accepted."""
        ...

    async def promote(self, address: str, token: str) -> bool:
        """Ask a replica to promote itself; True when it accepted."""
        ...


class HttpInstanceClient:
    """:class:`InstanceClient` over HTTP to ``http://<pod IP>:<port>``.

    ``timeout`` bounds each request: a reconcile must not wait on a hung instance (the next pass asks again).
    The token is sent as a bearer header only, and never logged.
    """

    def __init__(self, *, port: int = 8008, timeout: float = 2.0) -> None:
        self.port = port
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _url(self, address: str, path: str) -> str:
        host = f"[{address}]" if ":" in address else address
        return f"http://{host}:{self.port}{path}"

    async def status(self, address: str) -> InstanceReport | None:
        try:
            async with self._http().get(self._url(address, "/status")) as response:
                if response.status != 200:
                    return None
                return parse_report(await response.json(content_type=None))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("instance status unavailable", address=address, error=type(exc).__name__)
            return None

    async def _post(self, address: str, path: str, token: str) -> bool:
        headers = {"Authorization": f"Bearer {token}"}
        try:
            async with self._http().post(self._url(address, path), headers=headers) as response:
                return 200 <= response.status < 300
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("instance request failed", address=address, path=path, error=type(exc).__name__)
            return False

    async def restart(self, address: str, token: str) -> bool:
        return await self._post(address, "/restart", token)

    async def promote(self, address: str, token: str) -> bool:
        return await self._post(address, "/promote", token)


async def gather_reports(client: InstanceClient, addresses: dict[str, str]) -> dict[str, InstanceReport]:
    """Ask every instance (name -> pod IP) at once; instances that do not answer are left out."""
    names = list(addresses)
    answers = await asyncio.gather(*(client.status(addresses[name]) for name in names))
    return {name: report for name, report in zip(names, answers, strict=True) if report is not None}
