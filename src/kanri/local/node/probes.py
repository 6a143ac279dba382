"""Container probes (startup, liveness, readiness) with the kubelet's semantics, for the local node.

Two layers:

* :func:`run_probe` runs one attempt of one probe (``httpGet``, ``tcpSocket``, ``exec``; ``grpc`` is reported as
  unsupported) and returns a :class:`ProbeResult` whose ``message`` is what the kubelet would put in its event.
* :class:`ContainerProber` runs a container's probes for as long as one process of it runs: the startup probe
  first (liveness and readiness wait until it has succeeded), thresholds, and a restart verdict when liveness or
  startup fails. The kubelet creates one per container start and stops it when the process exits.

Behaviour follows ``pkg/probe`` and ``pkg/kubelet/prober`` of Kubernetes: 200-399 is success, a 3xx that ends the
redirect chain (another host, or no ``Location``) is a success with a ``ProbeWarning``, redirects to the same host are
followed up to 10, response bodies and exec output are cut at 10 KiB, an attempt that *errored* (the probe could not
be run at all: unknown named port, no handler, grpc here) emits an event but does not count towards a threshold.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import structlog
from multidict import CIMultiDict
from yarl import URL

from kanri.local.node.containers import expand
from kanri.local.node.state import NodeState

Obj = Mapping[str, Any]
log = structlog.get_logger("kanri.local.probes")

ExecFn = Callable[[list[str], float], Awaitable[tuple[int, str]]]
"""Runs ``argv`` "in the container" within ``timeout`` seconds: ``(exit code, combined output)``. Raises
:class:`TimeoutError` when the timeout passes (after killing what it started) and :class:`OSError` when the command
cannot be started. :func:`subprocess_exec` builds one that runs local processes."""

ProbeKind = Literal["startup", "liveness", "readiness"]

USER_AGENT = "kube-probe/0.0"
"""``kube-probe/<major>.<minor>`` of the kubelet version, as the kubelet sends it. Ours reports ``v0.0.0-kanri``
(see ``node.py``); applications that look at it match the ``kube-probe/`` prefix."""

MAX_OUTPUT = 10 * 1024
"""The kubelet reads at most 10 KiB of a response body or of an exec probe's output."""

MAX_REDIRECTS = 10
GRPC_UNSUPPORTED = "grpc probes are not supported by the local node"

_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_PROBE_FIELDS: dict[ProbeKind, str] = {
    "startup": "startupProbe",
    "liveness": "livenessProbe",
    "readiness": "readinessProbe",
}
_EVENT_KIND = {"startup": "Startup", "liveness": "Liveness", "readiness": "Readiness"}


@dataclass(frozen=True)
class ProbeResult:
    """One probe attempt.

    ``success`` counts towards ``successThreshold``, a failure towards ``failureThreshold``. ``warning`` marks a
    success worth a ``ProbeWarning`` event (a redirect that was not followed). ``errored`` marks an attempt that
    could not be made at all (the kubelet's "probe errored"): reported, but counted neither way. ``message`` is the
    kubelet's detail: the body or output on success, the reason on failure.
    """

    success: bool
    message: str
    warning: bool = False
    errored: bool = False


@dataclass(frozen=True)
class ProbeSpec:
    """A probe's timing fields with the API server's defaults applied (a zero means "unset", as in defaulting)."""

    initial_delay: int = 0
    period: int = 10
    timeout: int = 1
    success_threshold: int = 1
    failure_threshold: int = 3
    termination_grace_period: int | None = None

    @classmethod
    def of(cls, probe: Obj, kind: ProbeKind) -> ProbeSpec:
        """The spec of ``probe`` used as a ``kind`` probe. ``successThreshold`` is 1 for liveness and startup (the
        API server rejects anything else; a pod that somehow has another value is not worth failing over)."""

        def field(name: str, default: int) -> int:
            value = probe.get(name)
            return int(value) if value else default

        return cls(
            initial_delay=max(int(probe.get("initialDelaySeconds") or 0), 0),
            period=field("periodSeconds", 10),
            timeout=field("timeoutSeconds", 1),
            success_threshold=field("successThreshold", 1) if kind == "readiness" else 1,
            failure_threshold=field("failureThreshold", 3),
            termination_grace_period=probe.get("terminationGracePeriodSeconds"),
        )


@dataclass(frozen=True)
class Verdict:
    """A liveness or startup probe reached its failure threshold: the container is to be killed (and restarted as
    ``restartPolicy`` says). ``grace_period_seconds`` is the probe's own ``terminationGracePeriodSeconds`` (it
    overrides the pod's for this kill), None to use the pod's."""

    probe: ProbeKind
    message: str
    """``"Liveness probe failed: <detail>"`` — the last failure, as in the Unhealthy event."""
    grace_period_seconds: int | None = None

    def killing_message(self, container_name: str, restart: bool = True) -> str:
        """The kubelet's ``Killing`` event message for this kill."""
        tail = "will be restarted" if restart else "will not be restarted"
        return f"Container {container_name} failed {self.probe} probe, {tail}"


class _ProbeError(Exception):
    """The probe cannot be run as specified (the kubelet's "probe errored")."""


# --- one attempt ----------------------------------------------------------------------------------------------------


async def run_probe(
    probe: Obj, container: Obj, pod_ip: str | None, exec_fn: ExecFn | None = None, source_ip: str | None = None
) -> ProbeResult:
    """Run ``probe`` (a ``livenessProbe``/``readinessProbe``/``startupProbe`` object) once against ``container``.

    ``pod_ip`` is the default host of ``httpGet`` and ``tcpSocket``; None means the container shares the node's
    network (no pod network yet), so 127.0.0.1. ``exec_fn`` runs ``exec`` commands; without it they error. Never
    raises for a probe that fails: the outcome is in the result. ``source_ip``: the local address network probes
    to the pod's own address connect from (the node's own, which a partition lets through)."""
    timeout = float(ProbeSpec.of(probe, "readiness").timeout)
    try:
        if "exec" in probe:
            return await _exec_probe(probe["exec"] or {}, container, exec_fn, timeout)
        if "httpGet" in probe:
            action = probe["httpGet"] or {}
            return await _http_probe(action, container, pod_ip, timeout, _source(action, source_ip))
        if "tcpSocket" in probe:
            action = probe["tcpSocket"] or {}
            return await _tcp_probe(action, container, pod_ip, timeout, _source(action, source_ip))
        if "grpc" in probe:
            # Errored rather than failed: we cannot judge the container, so it must not be restarted for it.
            return ProbeResult(False, GRPC_UNSUPPORTED, errored=True)
        return ProbeResult(False, f"missing probe handler for {container.get('name', '')}", errored=True)
    except _ProbeError as exc:
        return ProbeResult(False, str(exc), errored=True)


def resolve_port(port: object, container: Obj) -> int:
    """A probe's ``port``: a number, or the name of one of the container's ``ports`` (kubelet's
    ``ResolveContainerPort``, including its last-ditch reading of a numeric string)."""
    if isinstance(port, str):
        for entry in container.get("ports") or []:
            if entry.get("name") == port:
                port = entry.get("containerPort")
                break
        else:
            if not port.isdigit():
                raise _ProbeError(f"port {port} not found in the ports of container {container.get('name', '')}")
    try:
        number = int(str(port))  # an int, or a numeric string
    except ValueError:
        raise _ProbeError(f"invalid port: {port!r}") from None
    if not 0 < number < 65536:
        raise _ProbeError(f"invalid port number: {number}")
    return number


def _source(action: Obj, source_ip: str | None) -> tuple[str, int] | None:
    # Only towards the pod's own address: a probe naming another host goes the host's usual way.
    return (source_ip, 0) if source_ip and not action.get("host") else None


def _host(action: Obj, pod_ip: str | None) -> str:
    return str(action.get("host") or pod_ip or "127.0.0.1")


def _go_quote(text: str) -> str:
    """Roughly Go's ``%q``, so messages read like the kubelet's."""
    return json.dumps(text, ensure_ascii=False)


async def _exec_probe(action: Obj, container: Obj, exec_fn: ExecFn | None, timeout: float) -> ProbeResult:
    # The kubelet expands $(VAR) in an exec probe's command from the container's env, static values only
    # (ExpandContainerCommandOnlyStatic): a valueFrom variable reads as "".
    static = {str(var["name"]): str(var.get("value", "")) for var in container.get("env") or [] if var.get("name")}
    command = [expand(str(arg), static) for arg in action.get("command") or []]
    if not command:
        raise _ProbeError("exec probe has no command")
    if exec_fn is None:
        raise _ProbeError("exec probes are not available here")
    try:
        # exec_fn should enforce the timeout itself; this guards against one that does not.
        async with asyncio.timeout(timeout + 1):
            code, output = await exec_fn(command, timeout)
    except TimeoutError:
        return ProbeResult(False, f"command {_go_quote(' '.join(command))} timed out")
    except OSError as exc:
        return ProbeResult(False, f"failed to exec in container: {exc}")
    output = output[:MAX_OUTPUT]
    # As the kubelet: the detail of a failed exec probe is its output (possibly empty), not the exit code.
    return ProbeResult(code == 0, output)


async def _tcp_probe(
    action: Obj, container: Obj, pod_ip: str | None, timeout: float, source: tuple[str, int] | None = None
) -> ProbeResult:
    host, port = _host(action, pod_ip), resolve_port(action.get("port"), container)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port, local_addr=source)
    except TimeoutError:
        return ProbeResult(False, f"dial tcp {address}: i/o timeout")
    except OSError as exc:
        return ProbeResult(False, f"dial tcp {address}: {_os_error(exc)}")
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return ProbeResult(True, "")


def _os_error(exc: OSError) -> str:
    if exc.errno:
        return f"connect: {os.strerror(exc.errno).lower()}"
    return str(exc)


def _http_headers(action: Obj) -> tuple[CIMultiDict[str], set[str]]:
    """The request headers as the kubelet builds them, and the aiohttp auto-headers to suppress."""
    headers: CIMultiDict[str] = CIMultiDict()
    for header in action.get("httpHeaders") or []:
        if header.get("name"):
            headers.add(str(header["name"]), str(header.get("value", "")))
    skip = {"Accept-Encoding"}  # the kubelet's transport disables compression
    headers.setdefault("User-Agent", USER_AGENT)
    if "Accept" not in headers:
        headers["Accept"] = "*/*"
    elif not headers.get("Accept"):
        # An explicitly empty Accept removes the header (kubelet), so aiohttp must not add its own.
        del headers["Accept"]
        skip.add("Accept")
    return headers, skip


def _probe_url(action: Obj, container: Obj, pod_ip: str | None) -> URL:
    scheme = str(action.get("scheme") or "HTTP").lower()
    if scheme not in ("http", "https"):
        raise _ProbeError(f"unsupported scheme: {action.get('scheme')}")
    port = resolve_port(action.get("port"), container)
    path = str(action.get("path") or "/")
    target = URL(path if path.startswith("/") else "/" + path)
    return URL.build(scheme=scheme, host=_host(action, pod_ip), port=port).join(target)


async def _http_probe(
    action: Obj, container: Obj, pod_ip: str | None, timeout: float, source: tuple[str, int] | None = None
) -> ProbeResult:
    url = _probe_url(action, container, pod_ip)
    headers, skip = _http_headers(action)
    current = url
    # No keep-alive, no certificate verification, no proxy from the environment, no cookies: the kubelet's client.
    connector = aiohttp.TCPConnector(ssl=False, force_close=True, local_addr=source)
    async with aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), skip_auto_headers=skip, trust_env=False
    ) as session:
        try:
            async with asyncio.timeout(timeout):
                for hop in range(MAX_REDIRECTS + 1):
                    async with session.get(current, headers=headers, allow_redirects=False) as response:
                        location = response.headers.get("Location")
                        if response.status in _REDIRECT_STATUSES and location:
                            target = current.join(URL(location))
                            # Only redirects to the same host are followed; the kubelet stops at any other and
                            # judges the 3xx itself (a warning, not a failure).
                            if target.host == url.host:
                                if hop + 1 >= MAX_REDIRECTS:
                                    return ProbeResult(False, f'Get "{target}": stopped after 10 redirects')
                                current = target
                                continue
                        body = await _read_at_most(response.content, MAX_OUTPUT)
                        return _judge(response.status, body)
        except TimeoutError:
            return ProbeResult(
                False, f'Get "{current}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
            )
        except (aiohttp.ClientError, OSError) as exc:
            return ProbeResult(False, f'Get "{current}": {_client_error(exc)}')
    raise AssertionError("unreachable: the loop returns")  # pragma: no cover


def _judge(status: int, body: str) -> ProbeResult:
    if 200 <= status < 400:
        if status >= 300:
            return ProbeResult(True, f"Probe terminated redirects, Response body: {body}", warning=True)
        return ProbeResult(True, body)
    # The kubelet keeps the body out of the message (it may hold secrets; kubernetes#99425).
    return ProbeResult(False, f"HTTP probe failed with statuscode: {status}")


def _client_error(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"dial tcp {exc.host}:{exc.port}: {_os_error(exc.os_error)}"
    return str(exc) or type(exc).__name__


async def _read_at_most(stream: aiohttp.StreamReader | asyncio.StreamReader, limit: int) -> str:
    data = bytearray()
    while len(data) < limit:
        chunk = await stream.read(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", errors="replace")


def subprocess_exec(
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    user: int | None = None,
    group: int | None = None,
) -> ExecFn:
    """An :data:`ExecFn` running commands as local processes (the local node's "exec in the container"): with
    ``env``, ``cwd``, ``user``/``group`` (pass the container's), no stdin, stdout and stderr combined, in a process
    group of its own that is SIGKILLed when the timeout passes or the caller is cancelled."""

    async def run(argv: list[str], timeout: float) -> tuple[int, str]:
        extra: dict[str, Any] = {}
        if user is not None:
            extra = {"user": user, "group": group, "extra_groups": []}
        process = await asyncio.create_subprocess_exec(
            *argv,
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            **extra,
        )
        try:
            async with asyncio.timeout(timeout):
                assert process.stdout is not None
                output = await _read_at_most(process.stdout, MAX_OUTPUT)
                # Drain the rest so a chatty command cannot block on a full pipe.
                while await process.stdout.read(65536):
                    pass
                code = await process.wait()
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                await asyncio.shield(process.wait())
        return (code if code >= 0 else 128 - code), output

    return run


# --- per container --------------------------------------------------------------------------------------------------

OnRestart = Callable[[str], Awaitable[None] | None]
OnEvent = Callable[[str, str, str], Awaitable[None] | None]


class ContainerProber:
    """Runs one container instance's probes; create it when the process starts, :meth:`start` it, :meth:`stop` it
    when the process exits (a restarted container gets a new prober, as a new container ID gets new results).

    * ``started`` — False while a startup probe has not succeeded (True from the start without one). Liveness and
      readiness are not run before.
    * ``ready`` — with a readiness probe: False at first, True after ``successThreshold`` consecutive successes,
      False again after ``failureThreshold`` consecutive failures. Without one: ``started``.
    * ``verdict`` — set once, when the startup or liveness probe reached ``failureThreshold``; ``on_restart`` is
      called with its message then, and those two probes stop (readiness runs on until :meth:`stop`).

    Callbacks: ``on_change()`` when ``started`` or ``ready`` flips (synchronous; e.g. queue the pod);
    ``on_restart(message)`` for the verdict — when it returns an awaitable, that runs as a task of its own which
    :meth:`stop` does not cancel, so it may kill the process and wait; ``on_event(type, reason, message)`` for each
    event the kubelet would record (``Warning``/``Unhealthy`` for failed or errored attempts, ``Warning``/
    ``ProbeWarning`` for a redirect that was not followed), awaited in the probe loop when it returns an awaitable.
    No callback is called after :meth:`stop`.

    ``time_scale`` multiplies the schedule (``initialDelaySeconds``, ``periodSeconds``), not ``timeoutSeconds``:
    tests run periods of 1 s as 50 ms while timeouts stay real.
    """

    def __init__(
        self,
        container: Obj,
        pod_ip: str | None,
        exec_fn: ExecFn | None,
        *,
        on_change: Callable[[], None] = lambda: None,
        on_restart: OnRestart = lambda message: None,
        on_event: OnEvent | None = None,
        time_scale: float = 1.0,
        gate: NodeState | None = None,
        source_ip: str | None = None,
    ) -> None:
        self.container = container
        self._gate = gate
        self._source_ip = source_ip
        self.pod_ip = pod_ip
        self._exec_fn = exec_fn
        self._on_change = on_change
        self._on_restart = on_restart
        self._on_event = on_event
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self._scale = time_scale
        self._probes: dict[ProbeKind, Obj] = {
            kind: container[key] for kind, key in _PROBE_FIELDS.items() if container.get(key)
        }
        self._started = asyncio.Event()
        if "startup" not in self._probes:
            self._started.set()
        self._ready = "readiness" not in self._probes and self.started
        self.verdict: Verdict | None = None
        self.last_failure: str | None = None
        """The last failed or errored attempt's event message (``"Readiness probe failed: ..."``)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._callbacks: set[asyncio.Task[None]] = set()
        self._stopped = False
        self._t0 = 0.0

    @property
    def started(self) -> bool:
        """Whether the container counts as started (its startup probe succeeded, or it has none)."""
        return self._started.is_set()

    @property
    def ready(self) -> bool:
        """Whether the container counts as ready (see the class docstring)."""
        return self._ready

    def start(self) -> None:
        """Start the probe loops; ``initialDelaySeconds`` counts from now (call it as the process starts)."""
        if self._tasks or self._stopped:
            raise RuntimeError("a ContainerProber is started once")
        self._t0 = asyncio.get_running_loop().time()
        name = self.container.get("name", "")
        for kind, probe in self._probes.items():
            self._tasks.append(asyncio.create_task(self._loop(kind, probe), name=f"{kind} probe {name}"))

    async def stop(self) -> None:
        """Stop probing (idempotent). Returns once no probe of this container runs any more."""
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- the loops ------------------------------------------------------------------------------------------------

    async def _loop(self, kind: ProbeKind, probe: Obj) -> None:
        spec = ProbeSpec.of(probe, kind)
        loop = asyncio.get_running_loop()
        if kind != "startup":
            await self._started.wait()
        # initialDelaySeconds counts from the container's start, whatever the startup probe took.
        next_at = max(self._t0 + spec.initial_delay * self._scale, loop.time())
        if kind == "liveness" and "startup" in self._probes:
            # The kubelet's liveness worker probes at its next tick after the start: give a period of grace too.
            next_at = max(next_at, loop.time() + spec.period * self._scale)
        last: bool | None = None
        run = 0
        while not self._stopped:
            await asyncio.sleep(max(next_at - loop.time(), 0))
            if self._gate is not None and not self._gate.alive:
                # A frozen or stopped node probes nothing (a partitioned one does: its probes come from the node's
                # own address, which the partition lets through); probing resumes after.
                await self._gate.running()
                next_at = loop.time()
                continue
            result = await run_probe(probe, self.container, self.pod_ip, self._exec_fn, self._source_ip)
            # A fixed rate like the kubelet's ticker, without a burst to catch up after a slow attempt.
            next_at = max(next_at + spec.period * self._scale, loop.time())
            if self._stopped:
                return
            await self._report(kind, result)
            if result.errored:
                continue  # the kubelet throws the result of an errored probe away
            run = run + 1 if result.success == last else 1
            last = result.success
            if result.success and run < spec.success_threshold:
                continue
            if not result.success and run < spec.failure_threshold:
                continue
            if kind == "readiness":
                self._set_ready(result.success)
            elif result.success:
                if kind == "startup":
                    self._started.set()
                    self._ready = "readiness" not in self._probes
                    self._changed()
                    return
            else:
                self._restart(kind, spec, result)
                return

    async def _report(self, kind: ProbeKind, result: ProbeResult) -> None:
        name = _EVENT_KIND[kind]
        if result.errored:
            event = ("Warning", "Unhealthy", f"{name} probe errored: {result.message}")
        elif not result.success:
            event = ("Warning", "Unhealthy", f"{name} probe failed: {result.message}")
        elif result.warning:
            event = ("Warning", "ProbeWarning", f"{name} probe warning: {result.message}")
        else:
            return
        if event[1] == "Unhealthy":
            self.last_failure = event[2]
        log.debug("probe", container=self.container.get("name"), kind=kind, message=event[2])
        if self._on_event is not None:
            try:
                outcome = self._on_event(*event)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:
                # A broken event sink must not stop the probing.
                log.exception("probe event callback failed", container=self.container.get("name"))

    def _set_ready(self, ready: bool) -> None:
        if ready != self._ready:
            self._ready = ready
            self._changed()

    def _changed(self) -> None:
        if self._stopped:
            return
        try:
            self._on_change()
        except Exception:
            log.exception("probe on_change callback failed", container=self.container.get("name"))

    def _restart(self, kind: ProbeKind, spec: ProbeSpec, result: ProbeResult) -> None:
        if self.verdict is not None or self._stopped:
            return
        self.verdict = Verdict(
            kind, f"{_EVENT_KIND[kind]} probe failed: {result.message}", spec.termination_grace_period
        )
        log.info("probe verdict: restart", container=self.container.get("name"), message=self.verdict.message)
        try:
            outcome = self._on_restart(self.verdict.message)
        except Exception:
            log.exception("probe on_restart callback failed", container=self.container.get("name"))
            return
        if inspect.isawaitable(outcome):
            task = asyncio.ensure_future(self._guarded(outcome))
            self._callbacks.add(task)  # a reference, so the task is not collected half-way
            task.add_done_callback(self._callbacks.discard)

    async def _guarded(self, outcome: Awaitable[None]) -> None:
        try:
            await outcome
        except Exception:
            log.exception("probe on_restart callback failed", container=self.container.get("name"))
