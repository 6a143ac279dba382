"""Talking to the instance managers: ``GET /status``, ``POST /restart``, ``POST /promote``, ``POST /fence`` on port
8008.

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

from kanri.contract.problems import MAX_MESSAGE, REASONS

__all__ = [
    "PROBLEM_REASONS",
    "HttpInstanceClient",
    "InstanceClient",
    "InstanceProblem",
    "InstanceReport",
    "gather_reports",
    "parse_report",
]

log = structlog.get_logger("kanri.postgres.instances")
FENCE_TIMEOUT = 20.0


PROBLEM_REASONS = REASONS
"""The reasons an instance may report a problem with (kanri.contract.problems); anything else is read as
``InstanceProblem``."""
_MAX_TEXT = MAX_MESSAGE  # the instance manager keeps messages to one line of this length; a longer one is cut


@dataclass(frozen=True)
class InstanceProblem:
    """Something the user must fix that the instance found (``problems[]`` in ``GET /status``). The message never
    holds a Secret's or a file's content (the instance manager's side of the contract)."""

    reason: str
    message: str
    secret: str | None = None
    """The credential's purpose (``superuser``, ``replication``, ``app``, ``api``) for InvalidSecret."""
    key: str | None = None
    parameter: str | None = None
    """The ``postgresql.conf`` key for InvalidParameter."""


@dataclass(frozen=True)
class InstanceReport:
    """What one instance manager says about itself (``GET /status``)."""

    name: str
    role: str
    """``primary`` or ``replica`` as reported (PostgreSQL in recovery or not); the reconciler reads a fenced instance
    as ``fenced`` (``splitbrain.routed``)."""
    ready: bool
    running: bool
    timeline: int | None = None
    write_lsn: str | None = None
    receive_lsn: str | None = None
    replay_lsn: str | None = None
    lag_bytes: int | None = None
    pending_restart: bool = False
    pending_lowers: tuple[str, ...] = ()
    """Standby limits (``max_connections``, ...) waiting for a restart with a lower value: the primary goes first."""
    last_error: str | None = None
    system_identifier: str | None = None
    """The data directory's ``pg_control`` system identifier (a decimal string): one per cluster, kept by clones."""
    data_version: int | None = None
    """The major of the data directory (``PG_VERSION``), reported even when PostgreSQL cannot start."""
    binary_version: int | None = None
    """The major of the PostgreSQL binaries the pod runs."""
    problems: tuple[InstanceProblem, ...] = ()
    fenced: bool = False
    """The instance holds a fence marker: its PostgreSQL is kept stopped (``POST /fence``)."""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _names(value: Any) -> tuple[str, ...]:
    """A short list of parameter names (anything else in it is ignored)."""
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value[:16] if isinstance(v, str) and 0 < len(v) <= 63)


def _text(value: Any) -> str | None:
    """A short one-line string from an instance (it is shown in status and Events)."""
    if not isinstance(value, str) or not value.strip():
        return None
    flat = " ".join(value.split())
    return flat if len(flat) <= _MAX_TEXT else flat[: _MAX_TEXT - 1] + "…"


def _system_identifier(value: Any) -> str | None:
    # A uint64 printed in decimal; JSON numbers lose precision above 2**53, hence a string.
    return value if isinstance(value, str) and value.isdigit() and len(value) <= 20 else None


def _problems(value: Any) -> tuple[InstanceProblem, ...]:
    if not isinstance(value, list):
        return ()
    found: list[InstanceProblem] = []
    for item in value[:16]:  # a misbehaving instance must not fill status
        if not isinstance(item, dict) or (message := _text(item.get("message"))) is None:
            continue
        reason = item.get("reason")
        found.append(
            InstanceProblem(
                reason=reason if reason in PROBLEM_REASONS else "InstanceProblem",
                message=message,
                secret=_text(item.get("secret")),
                key=_text(item.get("key")),
                parameter=_text(item.get("parameter")),
            )
        )
    return tuple(found)


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
        pending_lowers=_names(body.get("pendingRestartLowers")),
        last_error=_str(body.get("lastError")),
        system_identifier=_system_identifier(body.get("systemIdentifier")),
        data_version=_int(body.get("dataVersion")),
        binary_version=_int(body.get("binaryVersion")),
        problems=_problems(body.get("problems")),
        fenced=body.get("fenced") is True,
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

    async def fence(self, address: str, token: str, reason: str) -> bool:
        """Ask the instance to stop PostgreSQL and keep it stopped; True once it is fenced."""
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

    async def _post(
        self, address: str, path: str, token: str, body: dict[str, Any] | None = None, timeout: float | None = None
    ) -> bool:
        headers = {"Authorization": f"Bearer {token}"}
        extra: dict[str, Any] = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
        try:
            async with self._http().post(self._url(address, path), headers=headers, json=body, **extra) as response:
                return 200 <= response.status < 300
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("instance request failed", address=address, path=path, error=type(exc).__name__)
            return False

    async def restart(self, address: str, token: str) -> bool:
        return await self._post(address, "/restart", token)

    async def promote(self, address: str, token: str) -> bool:
        return await self._post(address, "/promote", token)

    async def fence(self, address: str, token: str, reason: str) -> bool:
        # PostgreSQL's fast shutdown takes a checkpoint: allow it longer than a status read (the marker is written
        # first, and the instance finishes the shutdown even if this request gives up).
        return await self._post(address, "/fence", token, {"reason": reason}, timeout=FENCE_TIMEOUT)


async def gather_reports(client: InstanceClient, addresses: dict[str, str]) -> dict[str, InstanceReport]:
    """Ask every instance (name -> pod IP) at once; instances that do not answer are left out."""
    names = list(addresses)
    answers = await asyncio.gather(*(client.status(addresses[name]) for name in names))
    return {name: report for name, report in zip(names, answers, strict=True) if report is not None}
