"""The node's kubelet API: the HTTPS port the API server reaches for ``kubectl logs`` (``pods/log``).

Served per node on its ``InternalIP`` (on the host's bridge, which the API server on the same host reaches) at a
port the kernel picks; the Node advertises it in ``status.daemonEndpoints.kubeletEndpoint.Port`` and the API server
dials ``InternalIP`` (``--kubelet-preferred-address-types=InternalIP``). Routes:

- ``GET /containerLogs/{namespace}/{pod}/{container}``: :mod:`kanri.local.node.containerlogs`.
- ``GET|POST /exec/{namespace}/{pod}/{container}`` (WebSocket only): :mod:`kanri.local.node.kubeletexec`.
- ``GET /healthz``: ``ok``.

TLS: the serving certificate is signed at start by the control plane's kubelet CA (``pki/kubelet-ca.*``, which the
API server verifies with ``--kubelet-certificate-authority``) for the node's addresses; client certificates are
optional but must chain to the cluster CA. Who may do what: :mod:`kanri.local.node.kubeletauth`. Not served:
attach, port-forward, exec over SPDY, stats, metrics, the pods list.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from kanri.local.node.containerlogs import LogError, LogOptions, log_run, parse_options, read_log
from kanri.local.node.kubelet import Kubelet, log_path, user_and_group
from kanri.local.node.kubeletauth import AuthError, NodeAuthorizer
from kanri.local.node.kubeletexec import ContainerProcess, ExecRequest, serve_exec
from kanri.local.node.options import NodeOptions
from kanri.runtime import Cache, Client
from kanri.runtime.kinds import POD

Obj = dict[str, Any]
log = structlog.get_logger("kanri.local.kubeletapi")

_CERT_DAYS = 3650
_SHUTDOWN_TIMEOUT = 2.0


@dataclass(frozen=True)
class KubeletPKI:
    """The control plane's files a node needs: the cluster CA (to verify clients) and the kubelet CA (to sign its
    serving certificate)."""

    client_ca: Path
    signer_cert: Path
    signer_key: Path

    @classmethod
    def in_dir(cls, pki_dir: Path) -> KubeletPKI:
        """The files as the control plane lays them out in ``<data dir>/pki``."""
        return cls(pki_dir / "ca.crt", pki_dir / "kubelet-ca.crt", pki_dir / "kubelet-ca.key")


def issue_serving_certificate(pki: KubeletPKI, directory: Path, node: str, addresses: list[str]) -> tuple[Path, Path]:
    """Sign a fresh serving certificate for ``node`` (SANs: ``addresses`` and the node name) with the kubelet CA,
    with openssl (the standard library cannot). Returns the certificate's and the key's paths (key mode 0600)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise OSError("openssl is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    cert, key, config = directory / "kubelet.crt", directory / "kubelet.key", directory / "openssl.cnf"
    sans = ",".join([*(f"IP:{a}" for a in addresses), f"DNS:{node}"])
    config.write_text(
        "[req]\ndistinguished_name = dn\nprompt = no\n"
        f"[dn]\nCN = {node}\n"
        "[ext]\nbasicConstraints = critical,CA:FALSE\nkeyUsage = critical,digitalSignature\n"
        f"extendedKeyUsage = serverAuth\nsubjectAltName = {sans}\n"
        "subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n"
    )
    key.unlink(missing_ok=True)
    # openssl writes the new key 0600 (its umask for keys), never readable by pods' users.
    argv = [
        openssl,
        "req",
        "-x509",
        "-new",
        "-config",
        str(config),
        "-extensions",
        "ext",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        str(_CERT_DAYS),
        "-keyout",
        str(key),
        "-out",
        str(cert),
        "-CA",
        str(pki.signer_cert),
        "-CAkey",
        str(pki.signer_key),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise OSError(f"openssl could not sign the kubelet serving certificate: {result.stderr.strip()}")
    return cert, key


def server_context(pki: KubeletPKI, cert: Path, key: Path) -> ssl.SSLContext:
    """TLS for the kubelet port: our certificate; a client certificate optional, but verified against the cluster
    CA when given (bearer-token clients send none)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.client_ca))
    context.load_cert_chain(str(cert), str(key))
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


class KubeletAPI:
    """One node's kubelet API server. :meth:`start` binds it and returns the port; :meth:`close` ends it, and any
    log being followed."""

    def __init__(self, kubelet: Kubelet, cache: Cache, client: Client, options: NodeOptions, pki: KubeletPKI) -> None:
        self._kubelet = kubelet
        self._cache = cache
        self.options = options
        self.pki = pki
        self.authorizer = NodeAuthorizer(client, options.name)
        self.port = 0
        """The bound port (0 until started)."""
        self._runner: web.AppRunner | None = None
        self._closing = False

    async def start(self) -> int:
        options = self.options
        directory = options.data_dir / "kubelet"
        cert, key = await asyncio.to_thread(
            issue_serving_certificate, self.pki, directory, options.name, [options.internal_ip, "127.0.0.1"]
        )
        app = web.Application(middlewares=[self._authenticate])
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._container_logs)
        app.router.add_get("/healthz", self._healthz)
        for method in ("GET", "POST"):  # a WebSocket upgrade is a GET; kubelets also take POST
            app.router.add_route(method, "/exec/{namespace}/{pod}/{container}", self._exec)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=_SHUTDOWN_TIMEOUT)
        await runner.setup()
        try:
            site = web.TCPSite(runner, options.internal_ip, 0, ssl_context=server_context(self.pki, cert, key))
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        log.info("kubelet API serving", node=options.name, address=f"{options.internal_ip}:{self.port}")
        return self.port

    async def close(self) -> None:
        self._closing = True  # followers stop at their next poll
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- auth ------------------------------------------------------------------------------------------------------

    @web.middleware
    async def _authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Every path, known or not, is authenticated and authorized first, as on a kubelet's secure port."""
        transport = request.transport
        peercert = transport.get_extra_info("peercert") if transport is not None else None
        try:
            user = await self.authorizer.authenticate(peercert, request.headers.get("Authorization"))
            await self.authorizer.authorize(user, request.method, request.path)
        except AuthError as exc:
            return web.Response(status=exc.status, text=str(exc))
        log.debug("kubelet API request", user=user.name, method=request.method, path=request.path)
        return await handler(request)

    # --- routes ----------------------------------------------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def _container_logs(self, request: web.Request) -> web.StreamResponse:
        namespace, name = request.match_info["namespace"], request.match_info["pod"]
        container = request.match_info["container"]
        try:
            options = parse_options(request.query)
            path, uid, run = self._log_file(namespace, name, container, options)
        except LogError as exc:
            return web.Response(status=exc.status, text=str(exc))

        def running() -> bool:
            transport = request.transport
            if self._closing or transport is None or transport.is_closing():
                return False  # the client left, or the node stops
            return self._running(uid, container, run)

        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        await response.prepare(request)  # headers now: a follower waits on a live stream, not on the first line
        with contextlib.suppress(ConnectionResetError):
            async for chunk in read_log(path, options, running=running):
                await response.write(chunk)
            await response.write_eof()
        return response

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        namespace, name = request.match_info["namespace"], request.match_info["pod"]
        container = request.match_info["container"]
        exec_request = ExecRequest.from_query(request.query, request.query.getall("command", []))
        if not exec_request.command:
            return web.Response(status=400, text="you must specify at least one command for the container")
        if not (exec_request.stdin or exec_request.stdout or exec_request.stderr):
            return web.Response(status=400, text="you must specify at least 1 of stdin, stdout, stderr")
        pod = self._cache.get(POD, name, namespace)
        if pod is None or (pod.get("spec") or {}).get("nodeName") != self.options.name:
            return web.Response(status=404, text="pod does not exist")
        spec = next((c for c in pod["spec"].get("containers") or [] if c["name"] == container), None)
        if spec is None:
            return web.Response(status=404, text=f'container "{container}" not found in pod "{name}"')
        worker = self._kubelet.workers.get(pod["metadata"]["uid"])
        pid = worker.init_pids.get(container) if worker is not None else None
        if pid is None:
            return web.Response(status=400, text=f'container "{container}" in pod "{name}" is not running')
        uid, gid = user_and_group(pod, spec)
        return await serve_exec(request, exec_request, ContainerProcess(pid, uid, gid))

    def _log_file(self, namespace: str, name: str, container: str, options: LogOptions) -> tuple[Path, str, int]:
        """The file of the run asked for, the pod's uid and the run, or :class:`LogError` as the kubelet says it."""
        pod = self._cache.get(POD, name, namespace)
        if pod is None or (pod.get("spec") or {}).get("nodeName") != self.options.name:
            raise LogError(404, f'pod "{name}" does not exist')
        if container not in [c["name"] for c in pod["spec"].get("containers") or []]:
            raise LogError(404, f'container "{container}" not found in pod "{name}"')
        uid = pod["metadata"]["uid"]
        run = log_run(self._status(pod, container), name, container, options.previous)
        path = log_path(self.options.data_dir, namespace, name, uid, container, run)
        if not path.is_file():
            raise LogError(400, f'container "{container}" in pod "{name}" has no log for run {run}')
        return path, uid, run

    def _status(self, pod: Obj, container: str) -> Obj | None:
        """The container's status as the node knows it now (its worker), else as last written to the pod."""
        worker = self._kubelet.workers.get(pod["metadata"]["uid"])
        if worker is not None:
            for state in worker.states:
                if state.name == container:
                    return state.status()
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") == container:
                return dict(status)
        return None

    def _running(self, uid: str, container: str, run: int) -> bool:
        worker = self._kubelet.workers.get(uid)
        if worker is None:
            return False
        return any(s.name == container and s.kind == "running" and s.restart_count == run for s in worker.states)


async def start_kubelet_api(kubelet: Kubelet, cache: Cache, client: Client, options: NodeOptions) -> KubeletAPI | None:
    """Serve one node's kubelet API when the options name the control plane's pki (``kubelet_pki_dir``). A node
    that cannot serve it (no openssl, its address not on this host) runs on without, and says so: only
    ``kubectl logs`` is missing then."""
    if options.kubelet_pki_dir is None:
        return None
    api = KubeletAPI(kubelet, cache, client, options, KubeletPKI.in_dir(options.kubelet_pki_dir))
    try:
        await api.start()
    except OSError as exc:
        log.warning("no kubelet API on this node: kubectl logs will not reach it", node=options.name, error=str(exc))
        return None
    return api
