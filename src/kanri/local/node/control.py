"""The node host's control endpoint: HTTP over a Unix socket in its data dir (root-only), for ``kanri local node``.

    GET  /nodes                 → [{"name", "zone", "state", "internalIP", "podCIDR", "pods"}, ...]
    POST /nodes/<name>/<verb>   → {"node": {...}, "changed": bool}     verb: stop start freeze thaw partition heal

Unknown node or verb: 404 / 400 with ``{"error": ...}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from kanri.local.node.host import VERBS, NodeHost

SOCKET_NAME = "control.sock"


SHORT_DIR = Path("/run/kanri")
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes with its NUL; bind() fails on a longer one


def socket_path(host_dir: Path) -> Path:
    """``<host dir>/control.sock``; when that is too long for a Unix socket (a deep test or ``KANRI_HOME`` dir),
    ``/run/kanri/node-<hash of the host dir>.sock`` instead — the same for every caller that names the same dir."""
    natural = host_dir / SOCKET_NAME
    if len(os.fsencode(natural)) <= _MAX_SOCKET_PATH:
        return natural
    digest = hashlib.sha256(os.fsencode(host_dir.resolve())).hexdigest()[:16]
    return SHORT_DIR / f"node-{digest}.sock"


def _app(host: NodeHost) -> web.Application:
    async def nodes(_: web.Request) -> web.Response:
        return web.json_response([n.describe() for n in host.nodes])

    async def verb(request: web.Request) -> web.Response:
        name, action = request.match_info["name"], request.match_info["verb"]
        if action not in VERBS:
            return web.json_response({"error": f"unknown verb {action!r} (one of {', '.join(VERBS)})"}, status=400)
        try:
            node = host.node(name)
        except KeyError as exc:
            return web.json_response({"error": str(exc.args[0])}, status=404)
        try:
            changed = await host.chaos(action, name)
        except Exception as exc:  # reported to the caller; the host's log has the details
            return web.json_response({"error": f"{action} {name}: {exc}"}, status=500)
        return web.json_response({"node": node.describe(), "changed": changed})

    app = web.Application()
    app.router.add_get("/nodes", nodes)
    app.router.add_post("/nodes/{name}/{verb}", verb)
    return app


@contextlib.asynccontextmanager
async def serving(host: NodeHost, path: Path) -> AsyncIterator[None]:
    """Serve the control endpoint on ``path`` (mode 0600: the verbs kill processes) until the block ends."""
    await asyncio.to_thread(path.parent.mkdir, mode=0o700, parents=True, exist_ok=True)
    await asyncio.to_thread(path.unlink, missing_ok=True)
    runner = web.AppRunner(_app(host), access_log=None)
    await runner.setup()
    old = os.umask(0o177)  # 0600 from the start: no window in which the socket is open to others
    try:
        await web.UnixSite(runner, str(path)).start()
    finally:
        os.umask(old)
    try:
        yield
    finally:
        await runner.cleanup()
        await asyncio.to_thread(path.unlink, missing_ok=True)


class ControlError(Exception):
    """The host is not running, or refused the request (the message says why)."""


async def call(path: Path, method: str, route: str) -> Any:
    """One request to the host's control endpoint at ``path``; the decoded JSON answer."""
    if not await asyncio.to_thread(path.exists):
        raise ControlError(f"no node host control socket at {path}; is the local cluster up (kanri local up)?")
    try:
        async with (
            aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(path))) as session,
            session.request(method, f"http://kanri-node-host{route}", timeout=aiohttp.ClientTimeout(total=60)) as r,
        ):
            answer = await r.json()
            if r.status >= 400:
                raise ControlError(str(answer.get("error") or answer))
            return answer
    except (aiohttp.ClientError, OSError) as exc:
        raise ControlError(f"the node host at {path} did not answer: {exc}") from exc
