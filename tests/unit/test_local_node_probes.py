"""Container probes against real local servers and processes (no HTTP mocks).

Schedules run scaled (``time_scale``): a ``periodSeconds: 1`` probe runs every 50 ms. Timeouts are not scaled.
Assertions wait for states with a generous deadline; none measures speed.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kanri.local.node.probes import (
    GRPC_UNSUPPORTED,
    USER_AGENT,
    ContainerProber,
    ProbeResult,
    ProbeSpec,
    Verdict,
    resolve_port,
    run_probe,
    subprocess_exec,
)

Obj = dict[str, Any]
SCALE = 0.05  # 1 s of probe schedule = 50 ms
LOCAL_EXEC = subprocess_exec()


# --- servers ------------------------------------------------------------------------------------------------------


@dataclass
class HttpServer:
    """An aiohttp app on 127.0.0.1: ``/health`` answers ``status``; every request is counted per path."""

    port: int = 0
    status: int = 200
    body: str = "ok"
    delay: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    headers: list[dict[str, str]] = field(default_factory=list)

    def count(self, path: str = "/health") -> int:
        return self.counts.get(path, 0)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.counts[request.path] = self.count(request.path) + 1
        self.headers.append(dict(request.headers))
        if self.delay:
            await asyncio.sleep(self.delay)
        if request.path == "/redirect":
            # ?to=<location>: a redirect to wherever the test says.
            raise web.HTTPFound(request.query["to"])
        if request.path == "/loop":
            raise web.HTTPFound("/loop")
        if request.path == "/ok":
            return web.Response(text="fine")
        return web.Response(status=self.status, text=self.body)


def _free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


async def _serve(server: HttpServer, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[HttpServer]:
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", server.handle)
    # A short shutdown: a test may leave a slow handler behind (the timeout test).
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.2)
    await runner.setup()
    sock = _free_socket()
    server.port = sock.getsockname()[1]
    site = web.SockSite(runner, sock, ssl_context=ssl_context)
    await site.start()
    try:
        yield server
    finally:
        await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[HttpServer]:
    async for server in _serve(HttpServer()):
        yield server


@pytest.fixture
async def https(tmp_path: Path) -> AsyncIterator[HttpServer]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    openssl = await asyncio.create_subprocess_exec(
        *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=probe.test"),
        *("-keyout", str(key), "-out", str(cert)),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert await openssl.wait() == 0
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    async for server in _serve(HttpServer(), context):
        yield server


@dataclass
class TcpServer:
    port: int
    accepted: int = 0
    server: asyncio.Server | None = None

    async def open(self) -> None:
        async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.accepted += 1
            writer.close()

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.server = await asyncio.start_server(accept, sock=sock)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None


@pytest.fixture
async def tcp() -> AsyncIterator[TcpServer]:
    sock = _free_socket()
    port = sock.getsockname()[1]
    sock.close()
    server = TcpServer(port)
    await server.open()
    try:
        yield server
    finally:
        await server.close()


# --- helpers ------------------------------------------------------------------------------------------------------


def http_probe(port: int | str, path: str = "/health", headers: list[Obj] | None = None, **fields: Any) -> Obj:
    action: Obj = {"port": port, "path": path, **({"httpHeaders": headers} if headers else {})}
    return {"httpGet": action, "periodSeconds": 1, **fields}


def container(**fields: Any) -> Obj:
    """A container spec; ``fields`` are its probes (``readinessProbe=...``) and anything else."""
    return {"name": "main", "image": "img", "ports": [{"name": "http", "containerPort": 0}], **fields}


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``check()`` holds (polling); fail after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while True:
            if check():
                return
            await asyncio.sleep(0.01)


async def periods(n: float) -> None:
    """Let ``n`` scaled probe periods of 1 s pass."""
    await asyncio.sleep(n * SCALE)


@dataclass
class Recorder:
    """Collects what a prober tells the kubelet."""

    changes: int = 0
    restarts: list[str] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def on_change(self) -> None:
        self.changes += 1

    async def on_restart(self, message: str) -> None:
        self.restarts.append(message)

    def on_event(self, kind: str, reason: str, message: str) -> None:
        self.events.append((kind, reason, message))

    def prober(self, spec: Obj, exec_fn: Any = LOCAL_EXEC) -> ContainerProber:
        return ContainerProber(
            spec,
            "127.0.0.1",
            exec_fn,
            on_change=self.on_change,
            on_restart=self.on_restart,
            on_event=self.on_event,
            time_scale=SCALE,
        )


@pytest.fixture
async def running() -> AsyncIterator[Callable[[ContainerProber], ContainerProber]]:
    """Start probers and make sure every one is stopped at the end of the test."""
    probers: list[ContainerProber] = []

    def start(prober: ContainerProber) -> ContainerProber:
        probers.append(prober)
        prober.start()
        return prober

    yield start
    for prober in probers:
        await prober.stop()


# --- one attempt: httpGet -----------------------------------------------------------------------------------------


async def test_http_success_sends_the_kubelets_headers(http: HttpServer) -> None:
    probe = http_probe(http.port, "/health?deep=1", [{"name": "X-Probe", "value": "yes"}])
    result = await run_probe(probe, container(), None)
    assert result == ProbeResult(True, "ok")
    sent = http.headers[-1]
    assert sent["User-Agent"] == USER_AGENT
    assert USER_AGENT.startswith("kube-probe/")
    assert sent["Accept"] == "*/*"
    assert sent["X-Probe"] == "yes"
    assert "Accept-Encoding" not in sent


async def test_http_headers_override_user_agent_and_empty_accept_is_dropped(http: HttpServer) -> None:
    headers = [
        {"name": "User-Agent", "value": "mine"},
        {"name": "Accept", "value": ""},
        {"name": "Host", "value": "app.example"},
    ]
    assert (await run_probe(http_probe(http.port, headers=headers), container(), "127.0.0.1")).success
    assert http.headers[-1]["User-Agent"] == "mine"
    assert "Accept" not in http.headers[-1]
    assert http.headers[-1]["Host"] == "app.example"


async def test_http_status_decides(http: HttpServer) -> None:
    http.status = 503
    result = await run_probe(http_probe(http.port), container(), "127.0.0.1")
    assert result == ProbeResult(False, "HTTP probe failed with statuscode: 503")
    http.status = 204
    assert (await run_probe(http_probe(http.port), container(), "127.0.0.1")).success
    http.status = 399
    result = await run_probe(http_probe(http.port), container(), "127.0.0.1")
    assert result.success  # 3xx without a Location: success with a warning, as the kubelet
    assert result.warning
    http.status = 400
    assert not (await run_probe(http_probe(http.port), container(), "127.0.0.1")).success


async def test_http_redirect_to_the_same_host_is_followed(http: HttpServer) -> None:
    probe = http_probe(http.port, "/redirect?to=/ok")
    assert await run_probe(probe, container(), "127.0.0.1") == ProbeResult(True, "fine")
    assert http.count("/ok") == 1


async def test_http_redirect_to_another_host_is_a_warning_not_followed(http: HttpServer) -> None:
    # localhost is another host name than 127.0.0.1 (the kubelet compares host names), though the same server.
    probe = http_probe(http.port, f"/redirect?to=http://localhost:{http.port}/ok")
    result = await run_probe(probe, container(), "127.0.0.1")
    assert result.success
    assert result.warning
    assert result.message.startswith("Probe terminated redirects, Response body: ")
    assert http.count("/ok") == 0


async def test_http_redirect_loop_fails_after_ten(http: HttpServer) -> None:
    result = await run_probe(http_probe(http.port, "/loop"), container(), "127.0.0.1")
    assert not result.success
    assert result.message.endswith("stopped after 10 redirects")
    assert http.count("/loop") == 10


async def test_http_named_port_resolves(http: HttpServer) -> None:
    spec = container()
    spec["ports"] = [{"name": "metrics", "containerPort": 1}, {"name": "http", "containerPort": http.port}]
    assert (await run_probe(http_probe("http"), spec, "127.0.0.1")).success
    assert resolve_port("http", spec) == http.port
    assert resolve_port(str(http.port), spec) == http.port  # the kubelet's last-ditch numeric string
    missing = await run_probe(http_probe("admin"), spec, "127.0.0.1")
    assert missing.errored
    assert "port admin not found" in missing.message


async def test_http_timeout_fails_with_a_message(http: HttpServer) -> None:
    http.delay = 3
    result = await run_probe(http_probe(http.port, timeoutSeconds=1), container(), "127.0.0.1")
    assert not result.success
    assert not result.errored
    assert "context deadline exceeded" in result.message
    assert f"127.0.0.1:{http.port}/health" in result.message


async def test_http_connection_refused(http: HttpServer) -> None:
    sock = _free_socket()
    port = sock.getsockname()[1]
    sock.close()
    result = await run_probe(http_probe(port), container(), "127.0.0.1")
    assert not result.success
    assert f"dial tcp 127.0.0.1:{port}: connect: connection refused" in result.message


async def test_https_does_not_verify_the_certificate(https: HttpServer) -> None:
    probe = http_probe(https.port)
    probe["httpGet"]["scheme"] = "HTTPS"
    assert await run_probe(probe, container(), "127.0.0.1") == ProbeResult(True, "ok")
    assert https.count() == 1


# --- one attempt: tcpSocket, exec, grpc ----------------------------------------------------------------------------


async def test_tcp_probe_follows_the_listener(tcp: TcpServer) -> None:
    probe = {"tcpSocket": {"port": tcp.port}}
    assert (await run_probe(probe, container(), "127.0.0.1")).success
    await eventually(lambda: tcp.accepted == 1)
    await tcp.close()
    result = await run_probe(probe, container(), "127.0.0.1")
    assert not result.success
    assert result.message == f"dial tcp 127.0.0.1:{tcp.port}: connect: connection refused"
    await tcp.open()
    assert (await run_probe(probe, container(), None)).success  # no pod IP: the node's own network


async def test_exec_probe_runs_real_processes() -> None:
    ok = await run_probe({"exec": {"command": ["sh", "-c", "echo fine"]}}, container(), None, LOCAL_EXEC)
    assert ok == ProbeResult(True, "fine\n")
    bad = await run_probe({"exec": {"command": ["sh", "-c", "echo sick >&2; exit 1"]}}, container(), None, LOCAL_EXEC)
    assert bad == ProbeResult(False, "sick\n")
    spec = container(env=[{"name": "WORD", "value": "static"}, {"name": "SECRET", "valueFrom": {"secretKeyRef": {}}}])
    expanded = await run_probe({"exec": {"command": ["echo", "$(WORD)-$(SECRET)-$(NONE)"]}}, spec, None, LOCAL_EXEC)
    assert expanded.message == "static--$(NONE)\n"  # static values only, as the kubelet expands them
    missing = await run_probe({"exec": {"command": ["/nonexistent/probe"]}}, container(), None, LOCAL_EXEC)
    assert not missing.success
    assert "/nonexistent/probe" in missing.message


async def test_exec_timeout_fails_and_kills_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "survived"
    command = ["sh", "-c", f"sleep 1.5; touch {marker}"]
    result = await run_probe({"exec": {"command": command}, "timeoutSeconds": 1}, container(), None, LOCAL_EXEC)
    assert result == ProbeResult(False, f'command "sh -c sleep 1.5; touch {marker}" timed out')
    await asyncio.sleep(1.0)
    assert not marker.exists()  # the whole process group was killed, not just sh


async def test_grpc_and_missing_handlers_are_reported_not_run() -> None:
    grpc = await run_probe({"grpc": {"port": 9090}}, container(), "127.0.0.1")
    assert grpc == ProbeResult(False, GRPC_UNSUPPORTED, errored=True)
    assert grpc.message == "grpc probes are not supported by the local node"
    nothing = await run_probe({"periodSeconds": 1}, container(), "127.0.0.1")
    assert nothing.errored
    no_exec = await run_probe({"exec": {"command": ["true"]}}, container(), None, None)
    assert no_exec.errored


def test_spec_defaults_and_liveness_success_threshold() -> None:
    assert ProbeSpec.of({"httpGet": {"port": 1}}, "readiness") == ProbeSpec(0, 10, 1, 1, 3)
    probe = {"successThreshold": 3, "failureThreshold": 5, "periodSeconds": 2, "terminationGracePeriodSeconds": 7}
    assert ProbeSpec.of(probe, "readiness").success_threshold == 3
    liveness = ProbeSpec.of(probe, "liveness")
    assert (liveness.success_threshold, liveness.failure_threshold, liveness.period) == (1, 5, 2)
    assert liveness.termination_grace_period == 7
    verdict = Verdict("liveness", "Liveness probe failed: x")
    assert verdict.killing_message("main") == "Container main failed liveness probe, will be restarted"


# --- ContainerProber ----------------------------------------------------------------------------------------------

Start = Callable[[ContainerProber], ContainerProber]


async def test_no_probes_is_started_and_ready_at_once(running: Start) -> None:
    recorder = Recorder()
    prober = running(recorder.prober(container()))
    assert prober.started
    assert prober.ready
    await periods(3)
    assert recorder.changes == 0
    assert recorder.events == []


async def test_readiness_flips_with_thresholds(http: HttpServer, running: Start) -> None:
    recorder = Recorder()
    prober = running(recorder.prober(container(readinessProbe=http_probe(http.port))))
    assert prober.started
    assert not prober.ready  # a readiness probe exists: not ready before it succeeded
    await eventually(lambda: prober.ready)
    assert recorder.changes == 1

    http.status = 503
    failures_before = http.count()
    await eventually(lambda: not prober.ready)
    # The third failure flips it (failureThreshold 3): at least three failed requests, each with an Unhealthy event.
    assert http.count() - failures_before >= 3
    failed = [e for e in recorder.events if e[1] == "Unhealthy"]
    assert len(failed) >= 3
    assert failed[0] == ("Warning", "Unhealthy", "Readiness probe failed: HTTP probe failed with statuscode: 503")
    assert prober.last_failure == "Readiness probe failed: HTTP probe failed with statuscode: 503"
    assert recorder.restarts == []  # readiness never restarts anything
    assert recorder.changes == 2

    http.status = 200
    await eventually(lambda: prober.ready)
    assert recorder.changes == 3


async def test_readiness_needs_success_threshold_successes(http: HttpServer, running: Start) -> None:
    served_at_flip: list[int] = []
    prober = ContainerProber(
        container(readinessProbe=http_probe(http.port, successThreshold=3)),
        "127.0.0.1",
        None,
        on_change=lambda: served_at_flip.append(http.count()),  # requests served when ready flipped
        time_scale=SCALE,
    )
    running(prober)
    await eventually(lambda: prober.ready)
    assert served_at_flip[0] >= 3


async def test_initial_delay_holds_the_first_probe(http: HttpServer, running: Start) -> None:
    recorder = Recorder()
    prober = running(recorder.prober(container(readinessProbe=http_probe(http.port, initialDelaySeconds=20))))
    await periods(8)  # well inside the (scaled) 20 s delay
    assert http.count() == 0
    assert not prober.ready
    await eventually(lambda: prober.ready)


async def test_startup_gates_liveness_and_readiness(http: HttpServer, tmp_path: Path, running: Start) -> None:
    flag = tmp_path / "started"
    recorder = Recorder()
    spec = container(
        startupProbe={"exec": {"command": ["test", "-e", str(flag)]}, "periodSeconds": 1, "failureThreshold": 1000},
        livenessProbe=http_probe(http.port, "/live"),
        readinessProbe=http_probe(http.port, "/ready"),
    )
    prober = running(recorder.prober(spec))
    await periods(10)
    assert not prober.started
    assert not prober.ready
    assert http.count("/live") == http.count("/ready") == 0  # nothing but the startup probe runs
    assert recorder.events  # its failures are reported...
    assert recorder.events[0] == ("Warning", "Unhealthy", "Startup probe failed: ")
    assert recorder.restarts == []  # ...but far below the threshold

    flag.touch()
    await eventually(lambda: prober.started)
    await eventually(lambda: prober.ready and http.count("/live") >= 2)
    assert recorder.restarts == []


async def test_startup_without_readiness_makes_ready_when_started(running: Start) -> None:
    recorder = Recorder()
    spec = container(startupProbe={"exec": {"command": ["true"]}, "periodSeconds": 1})
    prober = running(recorder.prober(spec))
    assert not prober.started
    assert not prober.ready
    await eventually(lambda: prober.started)
    assert prober.ready
    assert recorder.changes == 1


async def test_startup_failure_threshold_is_a_restart_verdict(running: Start) -> None:
    recorder = Recorder()
    spec = container(
        startupProbe={"exec": {"command": ["sh", "-c", "echo not yet; exit 1"]}, "periodSeconds": 1},
        livenessProbe={"exec": {"command": ["true"]}, "periodSeconds": 1},
    )
    prober = running(recorder.prober(spec))
    await eventually(lambda: bool(recorder.restarts))
    assert recorder.restarts == ["Startup probe failed: not yet\n"]
    assert prober.verdict == Verdict("startup", "Startup probe failed: not yet\n")
    assert not prober.started
    unhealthy = len(recorder.events)
    assert unhealthy == 3  # failureThreshold 3, then the startup probe stops
    await periods(5)
    assert len(recorder.events) == unhealthy
    assert recorder.restarts == ["Startup probe failed: not yet\n"]


async def test_liveness_failure_gives_exactly_one_restart(http: HttpServer, running: Start) -> None:
    recorder = Recorder()
    probe = http_probe(http.port, "/health", failureThreshold=2, terminationGracePeriodSeconds=5)
    prober = running(recorder.prober(container(livenessProbe=probe)))
    assert prober.ready  # liveness does not gate readiness
    await eventually(lambda: http.count() >= 2)
    assert recorder.restarts == []

    http.status = 500
    await eventually(lambda: bool(recorder.restarts))
    assert recorder.restarts == ["Liveness probe failed: HTTP probe failed with statuscode: 500"]
    assert prober.verdict is not None
    assert prober.verdict.grace_period_seconds == 5
    after = http.count()
    await periods(10)
    assert http.count() == after  # liveness stops probing after its verdict
    assert len(recorder.restarts) == 1


async def test_liveness_tolerates_failures_below_threshold(http: HttpServer, running: Start) -> None:
    recorder = Recorder()
    running(recorder.prober(container(livenessProbe=http_probe(http.port, failureThreshold=5))))
    await eventually(lambda: http.count() >= 1)
    http.status = 500
    await eventually(lambda: len(recorder.events) >= 2)
    http.status = 200  # some failures, then success: the run is broken, no restart
    count = http.count()
    await eventually(lambda: http.count() >= count + 3)
    assert recorder.restarts == []


async def test_errored_probes_do_not_count(running: Start) -> None:
    recorder = Recorder()
    spec = container(livenessProbe={"grpc": {"port": 9090}, "periodSeconds": 1, "failureThreshold": 1})
    prober = running(recorder.prober(spec))
    await eventually(lambda: len(recorder.events) >= 3)
    assert recorder.events[0] == ("Warning", "Unhealthy", f"Liveness probe errored: {GRPC_UNSUPPORTED}")
    assert recorder.restarts == []
    assert prober.verdict is None


async def test_redirect_warning_event(http: HttpServer, running: Start) -> None:
    recorder = Recorder()
    probe = http_probe(http.port, f"/redirect?to=http://localhost:{http.port}/ok")
    prober = running(recorder.prober(container(readinessProbe=probe)))
    await eventually(lambda: prober.ready)
    kind, reason, message = recorder.events[0]
    assert (kind, reason) == ("Warning", "ProbeWarning")
    assert message.startswith("Readiness probe warning: Probe terminated redirects, Response body: ")


async def test_stop_ends_the_loops(http: HttpServer, tcp: TcpServer) -> None:
    recorder = Recorder()
    spec = container(
        livenessProbe={"tcpSocket": {"port": tcp.port}, "periodSeconds": 1},
        readinessProbe=http_probe(http.port),
    )
    prober = recorder.prober(spec)
    prober.start()
    await eventually(lambda: prober.ready and tcp.accepted >= 2)
    await prober.stop()
    requests, accepted, changes = http.count(), tcp.accepted, recorder.changes
    http.status = 503
    await periods(10)
    assert (http.count(), tcp.accepted, recorder.changes) == (requests, accepted, changes)
    await prober.stop()  # idempotent
    with pytest.raises(RuntimeError):
        prober.start()


async def test_async_on_restart_outlives_stop(http: HttpServer) -> None:
    """The kubelet's on_restart may kill the process and wait; stopping the prober (the process exited) must not
    cancel it half-way."""
    done = asyncio.Event()
    prober: ContainerProber | None = None

    async def on_restart(message: str) -> None:
        assert prober is not None
        await prober.stop()  # what the kubelet does when the killed process exits
        await asyncio.sleep(0.05)
        done.set()

    http.status = 500
    prober = ContainerProber(
        container(livenessProbe=http_probe(http.port, failureThreshold=1)),
        "127.0.0.1",
        None,
        on_restart=on_restart,
        time_scale=SCALE,
    )
    prober.start()
    await asyncio.wait_for(done.wait(), 10)
