"""Talking to the instance managers: ``GET /status``, ``POST /restart``, ``/promote``, ``/fence``, ``/unfence``,
``/replication/pause``, ``/replication/resume``, ``/demote`` and ``/rejoin`` on port 8008, each with the cluster's API
token (only ``/healthz`` and ``/readyz``, the kubelet's, are open).

The instance's state is not a Kubernetes object, so the controller cannot watch it: the reconciler asks every
instance on each pass (all at once, with a short timeout) and requeues itself periodically. :class:`InstanceClient`
is a Protocol so tests (and other transports) can stand in; :class:`HttpInstanceClient` is the real one.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import structlog

from kanri.contract.actions import BackupRequest, Demoted, FenceRequest, Paused, Promoted
from kanri.contract.pooler import PoolerRoleEnsured, PoolerRoleRequest
from kanri.contract.problems import REASONS
from kanri.contract.status import Archiver, InstanceStatus, Problem
from kanri.contract.wire import UNTRUSTED, text
from kanri.postgres import names
from kanri.postgres.credentials.secrets import secret_value
from kanri.runtime import Cache
from kanri.runtime.kinds import POD, SECRET

__all__ = [
    "PROBLEM_REASONS",
    "BackupAnswer",
    "Demoted",
    "HttpInstanceClient",
    "InstanceClient",
    "InstanceProblem",
    "InstanceReport",
    "Paused",
    "Promoted",
    "api_token",
    "gather_reports",
    "instance_endpoint",
    "parse_report",
]

log = structlog.get_logger("kanri.postgres.cluster.instances")
FENCE_TIMEOUT = 20.0
PAUSE_TIMEOUT = 12.0
"""The instance waits up to 10 s for its WAL receiver to stop."""
PROMOTE_TIMEOUT = 70.0
"""The instance waits up to 60 s for the end of recovery."""
DEMOTE_TIMEOUT = 60.0
"""A checkpoint and a clean shutdown of a busy primary."""
BACKUP_REQUEST_TIMEOUT = 10.0
"""Starting or reading a backup answers at once (the backup runs in the background)."""
EXPIRE_TIMEOUT = 330.0
"""Expiring deletes objects one backup after the other (the instance allows each deletion 300 s)."""


PROBLEM_REASONS = REASONS
"""The reasons an instance may report a problem with (kanri.contract.problems); anything else is read as
``InstanceProblem``."""


InstanceProblem = Problem
"""Something the user must fix that the instance found (``problems[]`` in ``GET /status``)."""
InstanceReport = InstanceStatus
"""What one instance manager says about itself (``GET /status``); the reconciler reads a fenced instance as
``fenced`` (``splitbrain.routed``)."""
ArchiverReport = Archiver
"""The primary's ``pg_stat_archiver``, read by :mod:`kanri.postgres.backup.archiving`."""
parse_report = InstanceStatus.read
"""An :class:`InstanceReport` from the JSON body, or None when it is not one (a wrong answer is no answer)."""


class InstanceClient(Protocol):
    """The operator's view of the instance managers' API."""

    async def status(
        self, address: str, timeout: float | None = None, *, token: str | None = None
    ) -> InstanceReport | None:
        """The instance's report, or None when it cannot be reached or answers nonsense (within ``timeout`` seconds
        when given, else the client's own). ``GET /status`` needs the cluster's API ``token``; without one, the
        last token used with this address is sent (a probe in the middle of an action, e.g. during a demotion)."""
        ...

    async def restart(self, address: str, token: str) -> bool:
        """Ask the instance to restart PostgreSQL; True when it accepted."""
        ...

    async def promote(self, address: str, token: str) -> Promoted | None:
        """Ask a replica to promote itself (it answers once promoted); None when it refused or did not answer."""
        ...

    async def fence(self, address: str, token: str, reason: str) -> bool:
        """Ask the instance to stop PostgreSQL and keep it stopped; True once it is fenced."""
        ...

    async def unfence(self, address: str, token: str) -> bool:
        """Lift the fence: the instance starts PostgreSQL again."""
        ...

    async def pause_replication(self, address: str, token: str) -> Paused | None:
        """Stop the replica's WAL receiver and keep it stopped; where it stopped, or None (refused, unreachable)."""
        ...

    async def resume_replication(self, address: str, token: str) -> bool:
        """Let the replica stream again."""
        ...

    async def demote(self, address: str, token: str) -> Demoted | None:
        """Shut the primary down cleanly and start it as a replica (a switchover's first step)."""
        ...

    async def rejoin(self, address: str, token: str) -> bool:
        """Start the rejoin of a former primary (pg_rewind or a fresh clone) in the background; True when accepted."""
        ...


@dataclass(frozen=True)
class BackupAnswer:
    """The instance's answer to a backup request (``POST /backups``, ``GET /backups/{id}``, ``POST
    /backups/expire``): the HTTP status (0: no answer at all), its JSON body, and its error message."""

    status: int
    body: dict[str, Any]
    error: str | None = None


class HttpInstanceClient:
    """:class:`InstanceClient` over HTTP to ``http://<pod IP>:<port>``, or HTTPS with the cluster's CA verified for
    the pods :meth:`trust` named.

    ``timeout`` bounds each request: a reconcile must not wait on a hung instance (the next pass asks again).
    The token is sent as a bearer header only, and never logged.
    """

    def __init__(self, *, port: int = 8008, timeout: float = 2.0, plain: bool = False) -> None:
        self.port = port
        self.timeout = timeout
        self.plain = plain
        """Plain HTTP to every address, :meth:`trust` or not (for fake instance managers in tests)."""
        self._session: aiohttp.ClientSession | None = None
        self._clusters: dict[str, tuple[frozenset[str], bytes, ssl.SSLContext, str]] = {}  # cluster → pods, CA, ...
        self._trusted: dict[str, tuple[ssl.SSLContext, str]] = {}  # address → (its cluster's context, server name)
        # address → the API token last used with it, for status reads that name none (failover's probes); replaced at
        # every pass's gather_reports, which passes the cluster's token for each of its pods' current addresses.
        self._tokens: dict[str, str] = {}

    def trust(self, cluster: str, addresses: Iterable[str], ca_pem: bytes | None, server_name: str) -> None:
        """Speak HTTPS to ``addresses`` (``cluster``'s pods that serve TLS; the set replaces the previous one),
        verifying the certificate against ``ca_pem`` for ``server_name`` (a name every instance's certificate
        carries: pods are reached by IP). Any other address is spoken to in plain HTTP (an instance manager without
        a certificate). ``ca_pem`` None forgets the cluster."""
        if ca_pem is None or self.plain:
            self._clusters.pop(cluster, None)
        else:
            known = self._clusters.get(cluster)
            if known is not None and known[1] == ca_pem:
                context = known[2]
            else:  # a new CA (or a first look): a new context
                context = ssl.create_default_context(cadata=ca_pem.decode())
            self._clusters[cluster] = (frozenset(addresses), ca_pem, context, server_name)
        self._trusted = {a: (c, n) for pods, _, c, n in self._clusters.values() for a in pods}

    def _tls(self, address: str) -> dict[str, Any]:
        trusted = self._trusted.get(address)
        return {} if trusted is None else {"ssl": trusted[0], "server_hostname": trusted[1]}

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _url(self, address: str, path: str) -> str:
        host = f"[{address}]" if ":" in address else address
        scheme = "https" if address in self._trusted else "http"
        return f"{scheme}://{host}:{self.port}{path}"

    def _bearer(self, address: str, token: str | None) -> dict[str, str]:
        """The Authorization header for ``address``: ``token``, remembered for the address, or the one remembered."""
        if token:
            self._tokens[address] = token
        known = self._tokens.get(address)
        return {"Authorization": f"Bearer {known}"} if known else {}

    async def status(
        self, address: str, timeout: float | None = None, *, token: str | None = None
    ) -> InstanceReport | None:
        extra: dict[str, Any] = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
        headers = self._bearer(address, token)
        try:
            async with self._http().get(self._url(address, "/status"), headers=headers, **self._tls(address),
                                        **extra) as response:  # fmt: skip
                if response.status in (401, 403):
                    # alive, but it refuses the cluster's API token (a recreated <cluster>-api Secret not yet
                    # remounted): say so, this is no network fault
                    log.warning("instance refused the API token for /status", address=address,
                                status=response.status)  # fmt: skip
                if response.status != 200:
                    return None
                return parse_report(await response.json(content_type=None))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("instance status unavailable", address=address, error=type(exc).__name__)
            return None

    async def _call(
        self, address: str, path: str, token: str, body: dict[str, Any] | None = None, timeout: float | None = None
    ) -> dict[str, Any] | None:
        """POST an action; its JSON answer when it succeeded (2xx), else None (refused, unreachable, nonsense)."""
        headers = self._bearer(address, token)
        extra: dict[str, Any] = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
        extra |= self._tls(address)
        try:
            async with self._http().post(self._url(address, path), headers=headers, json=body, **extra) as response:
                if not 200 <= response.status < 300:
                    log.info("instance refused", address=address, path=path, status=response.status,
                             reason=text((await response.json(content_type=None) or {}).get("error")))  # fmt: skip
                    return None
                answer = await response.json(content_type=None)
                return answer if isinstance(answer, dict) else {}
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as exc:
            log.info("instance request failed", address=address, path=path, error=type(exc).__name__)
            return None

    async def _post(
        self, address: str, path: str, token: str, body: dict[str, Any] | None = None, timeout: float | None = None
    ) -> bool:
        return await self._call(address, path, token, body, timeout) is not None

    async def restart(self, address: str, token: str) -> bool:
        return await self._post(address, "/restart", token)

    async def promote(self, address: str, token: str) -> Promoted | None:
        answer = await self._call(address, "/promote", token, timeout=PROMOTE_TIMEOUT)
        return None if answer is None else Promoted.read(answer)

    async def fence(self, address: str, token: str, reason: str) -> bool:
        # PostgreSQL's fast shutdown takes a checkpoint: allow it longer than a status read (the marker is written
        # first, and the instance finishes the shutdown even if this request gives up).
        return await self._post(address, "/fence", token, FenceRequest(reason=reason).as_json(), timeout=FENCE_TIMEOUT)

    async def unfence(self, address: str, token: str) -> bool:
        return await self._post(address, "/unfence", token)

    async def pause_replication(self, address: str, token: str) -> Paused | None:
        answer = await self._call(address, "/replication/pause", token, timeout=PAUSE_TIMEOUT)
        return None if answer is None else Paused.read(answer)

    async def resume_replication(self, address: str, token: str) -> bool:
        return await self._post(address, "/replication/resume", token)

    async def demote(self, address: str, token: str) -> Demoted | None:
        answer = await self._call(address, "/demote", token, timeout=DEMOTE_TIMEOUT)
        return None if answer is None else Demoted.read(answer)

    async def rejoin(self, address: str, token: str) -> bool:
        return await self._post(address, "/rejoin", token)

    # Base backups (kanri.postgres.backup.controller): the answer's status matters (404 unknown id, 409 busy), so
    # these return it rather than a bool.

    async def _backup_request(
        self,
        method: str,
        address: str,
        path: str,
        token: str,
        body: dict[str, Any] | None = None,
        timeout: float = BACKUP_REQUEST_TIMEOUT,
    ) -> BackupAnswer:
        headers = {"Authorization": f"Bearer {token}"}
        extra = {"timeout": aiohttp.ClientTimeout(total=timeout)} | self._tls(address)
        try:
            async with self._http().request(method, self._url(address, path), headers=headers, json=body,
                                            **extra) as response:  # fmt: skip
                answer = await response.json(content_type=None)
                answer = answer if isinstance(answer, dict) else {}
                error = None if 200 <= response.status < 300 else (text(answer.get("error")) or "refused")
                return BackupAnswer(response.status, answer, error)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.info("instance backup request failed", address=address, path=path, error=type(exc).__name__)
            return BackupAnswer(0, {}, f"no answer ({type(exc).__name__})")

    async def start_backup(self, address: str, token: str, backup: str) -> BackupAnswer:
        """``POST /backups {"id"}``: 202 started, 200 the id is known (its record), 409 another one runs."""
        return await self._backup_request("POST", address, "/backups", token, BackupRequest(id=backup).as_json())

    async def backup_record(self, address: str, token: str, backup: str) -> BackupAnswer:
        """``GET /backups/{id}``: 200 the record, 404 an id the instance never saw."""
        return await self._backup_request("GET", address, f"/backups/{backup}", token)

    async def expire_backups(self, address: str, token: str, ids: list[str], server: str | None = None) -> BackupAnswer:
        """``POST /backups/expire {"ids", "serverName"?}``: barman backup ids deleted (and the WAL only they needed),
        of the instance's own system or of the earlier one of this cluster ``server`` names."""
        body: dict[str, Any] = {"ids": ids} if server is None else {"ids": ids, "serverName": server}
        return await self._backup_request("POST", address, "/backups/expire", token, body,
                                          timeout=EXPIRE_TIMEOUT)  # fmt: skip

    async def backup_catalogue(self, address: str, token: str, server: str | None = None) -> BackupAnswer:
        """``POST /backups/catalogue {"serverName"?}``: every backup of the system in the repository (Barman Cloud's
        catalogue), whether or not a PostgresBackup records it."""
        body: dict[str, Any] = {} if server is None else {"serverName": server}
        return await self._backup_request("POST", address, "/backups/catalogue", token, body,
                                          timeout=EXPIRE_TIMEOUT)  # fmt: skip

    async def switch_wal(self, address: str, token: str) -> BackupAnswer:
        """``POST /wal/switch`` on the primary: its current WAL segment closed, so it is archived now."""
        return await self._backup_request("POST", address, "/wal/switch", token, {})

    async def ensure_pooler_role(self, address: str, token: str, request: PoolerRoleRequest) -> bool:
        """``POST /pooler/role`` on the primary: the pooler's lookup role and function (the body holds a SCRAM
        verifier, never a password; it is not logged)."""
        answer = await self._call(address, "/pooler/role", token, request.as_json(), timeout=10.0)
        return answer is not None and PoolerRoleEnsured.model_validate(answer, context=UNTRUSTED).ensured


async def gather_reports(
    client: InstanceClient, addresses: dict[str, str], token: str | None = None
) -> dict[str, InstanceReport]:
    """Ask every instance (name -> pod IP) at once, with the cluster's API ``token`` (``GET /status`` needs it);
    instances that do not answer are left out."""
    names = list(addresses)
    answers = await asyncio.gather(*(client.status(addresses[name], token=token) for name in names))
    return {name: report for name, report in zip(names, answers, strict=True) if report is not None}


def api_token(cache: Cache, namespace: str, cluster: str) -> str | None:
    """The cluster's instance API token (``token`` in the ``<cluster>-api`` Secret, from the cache), or None."""
    return secret_value(cache.get(SECRET, names.api_secret(cluster), namespace), "token")


def instance_endpoint(cache: Cache, namespace: str, cluster: str, instance: str) -> tuple[str, str] | None:
    """What an action on one instance needs, from the cache: its pod's IP and the cluster's API token; None when
    either is missing (the pod gone or not running, the Secret not there yet)."""
    pod = cache.get(POD, names.pod_name(instance), namespace)
    address = ((pod or {}).get("status") or {}).get("podIP")
    token = api_token(cache, namespace, cluster)
    return None if token is None or not address else (str(address), token)
