"""The HTTP API the operator (and the kubelet's probes) talk to.

``GET /readyz`` and ``GET /healthz`` are open: the kubelet's probes carry no token, and they say only whether the
instance is alive and ready (with the reason when not). ``GET /status`` (roles, system identifier, LSNs, timelines,
the backup repository's path: no secret, but more than health) and every ``POST`` (``/promote``, ``/restart``,
``/fence``, ``/unfence``, ``/replication/pause``, ``/replication/resume``, ``/demote``, ``/rejoin``) need
``Authorization: Bearer <token>`` with the token from ``KANRI_API_TOKEN_FILE`` (read on every request, so a rotated
Secret takes effect without a restart). Base backups (:mod:`kanri.instance.base_backup`), all authenticated:
``POST /backups {"id"}`` (202 started, 200 known id), ``GET /backups/{id}``, ``POST /backups/expire {"ids"}``,
``POST /backups/catalogue`` (every backup of the system in the repository), ``POST /wal/switch`` (a primary
closes its current WAL segment, so a backup's last one is archived now).
``POST /pooler/role {"verifier", "databases"}``: the connection pooler's lookup role
(:mod:`kanri.instance.pooler_role`).
An action's body is empty or a JSON object (``/fence`` reads
``reason``). An action answers 200, or 202 when it returns :class:`Accepted` (it goes on in the background). Errors
are JSON: ``{"error": "..."}``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog
from aiohttp import web

log = structlog.get_logger("kanri.instance.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ActionError(Exception):
    """An action the instance refuses or cannot do now; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Accepted(dict[str, Any]):
    """An action's answer when the work goes on in the background: sent with 202."""


class Backend(Protocol):
    """What the API needs from the manager."""

    async def status(self) -> dict[str, Any]: ...

    async def not_ready_reason(self) -> str | None: ...

    async def promote(self) -> dict[str, Any]: ...

    async def restart(self) -> dict[str, Any]: ...

    async def fence(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def unfence(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def pause_replication(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def resume_replication(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def demote(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def rejoin(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def api_token(self) -> str | None: ...


class BackupBackend(Protocol):
    """What the backup endpoints need from the manager (optional: without it they are not served)."""

    async def start_backup(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def backup_record(self, backup: str) -> dict[str, Any]: ...

    async def expire_backups(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def backup_catalogue(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def switch_wal(self, body: dict[str, Any]) -> dict[str, Any]: ...


class PoolerBackend(Protocol):
    """What the pooler role's endpoint needs from the manager (optional: without it it is not served)."""

    async def ensure_pooler_role(self, body: dict[str, Any]) -> dict[str, Any]: ...


MAX_BODY = 4096
"""An action's body is a few fields at most."""


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


async def _body(request: web.Request) -> dict[str, Any]:
    """The action's JSON object body ({} when empty); ActionError 400 for anything else."""
    raw = await request.content.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise ActionError(413, f"the body may hold at most {MAX_BODY} bytes")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise ActionError(400, "the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise ActionError(400, "the body must be a JSON object")
    return body


def _authorized(backend: Backend, request: web.Request) -> bool:
    """The request carries the current API token (compared in constant time)."""
    token = backend.api_token()
    header = request.headers.get("Authorization", "")
    if not token or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header.removeprefix("Bearer ").strip().encode(), token.encode())


def _action(backend: Backend, run: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]], name: str) -> Handler:
    """An authenticated ``POST`` whose JSON body goes to ``run``; its answer is 200 (202 when :class:`Accepted`)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if not _authorized(backend, request):
            log.warning("refused unauthorized request", action=name, peer=request.remote)
            return _error(401, "a valid bearer token is required")
        log.info("action requested", action=name, peer=request.remote)
        try:
            answer = await run(await _body(request))
            return web.json_response(dict(answer), status=202 if isinstance(answer, Accepted) else 200)
        except ActionError as exc:
            log.warning("action refused", action=name, status=exc.status, reason=exc.reason)
            return _error(exc.status, exc.reason)
        except Exception as exc:  # e.g. the server went away mid-action: still a JSON answer, and a log line
            log.exception("action failed", action=name)
            return _error(500, f"{name} failed: {exc}")

    return handler


def _add_backup_routes(app: web.Application, backend: Backend, backups: BackupBackend) -> None:
    async def backup_record(request: web.Request) -> web.StreamResponse:
        if not _authorized(backend, request):
            return _error(401, "a valid bearer token is required")
        try:
            return web.json_response(await backups.backup_record(request.match_info["id"]))
        except ActionError as exc:
            return _error(exc.status, exc.reason)

    app.router.add_post("/backups", _action(backend, backups.start_backup, "backup"))
    app.router.add_post("/backups/expire", _action(backend, backups.expire_backups, "expire backups"))
    app.router.add_post("/backups/catalogue", _action(backend, backups.backup_catalogue, "list backups"))
    app.router.add_get("/backups/{id}", backup_record)
    app.router.add_post("/wal/switch", _action(backend, backups.switch_wal, "switch WAL"))


def build_app(
    backend: Backend, backups: BackupBackend | None = None, pooler: PoolerBackend | None = None
) -> web.Application:
    """The aiohttp application over ``backend`` (and ``backups``' and ``pooler``'s endpoints when given)."""

    async def status(request: web.Request) -> web.StreamResponse:
        if not _authorized(backend, request):
            log.info("refused unauthorized status request", peer=request.remote)
            return _error(401, "a valid bearer token is required")
        return web.json_response(await backend.status())

    async def readyz(_: web.Request) -> web.StreamResponse:
        reason = await backend.not_ready_reason()
        if reason is None:
            return web.json_response({"ready": True})
        return web.json_response({"ready": False, "reason": reason}, status=503)

    async def healthz(_: web.Request) -> web.StreamResponse:
        return web.json_response({"alive": True})

    app = web.Application()
    app.router.add_get("/status", status)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/promote", _action(backend, lambda _: backend.promote(), "promote"))
    app.router.add_post("/restart", _action(backend, lambda _: backend.restart(), "restart"))
    app.router.add_post("/fence", _action(backend, backend.fence, "fence"))
    app.router.add_post("/unfence", _action(backend, backend.unfence, "unfence"))
    app.router.add_post("/replication/pause", _action(backend, backend.pause_replication, "pause replication"))
    app.router.add_post("/replication/resume", _action(backend, backend.resume_replication, "resume replication"))
    app.router.add_post("/demote", _action(backend, backend.demote, "demote"))
    app.router.add_post("/rejoin", _action(backend, backend.rejoin, "rejoin"))
    if backups is not None:
        _add_backup_routes(app, backend, backups)
    if pooler is not None:
        app.router.add_post("/pooler/role", _action(backend, pooler.ensure_pooler_role, "pooler role"))
    return app
