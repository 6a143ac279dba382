"""The Manager runs controllers: shared cache, leader election, health and metrics endpoints (metrics optionally
behind the API server's authentication and authorization), graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kanri.runtime._cache import Cache
from kanri.runtime._client import Client
from kanri.runtime._controller import Controller
from kanri.runtime._controller_metrics import ControllerMetrics
from kanri.runtime._events import EventRecorder
from kanri.runtime._informer import WatchTiming
from kanri.runtime._leader import LeaderElector, default_identity
from kanri.runtime._metrics_auth import MetricsAuthorizer
from kanri.runtime._queue_metrics import WorkQueueMetrics

log = structlog.get_logger("kanri.manager")


@dataclass(frozen=True)
class ManagerOptions:
    """How a Manager runs. Leader-election timings are controller-runtime's defaults."""

    name: str
    """Names the leader-election Lease and appears in logs."""
    leader_election: bool = True
    leader_election_namespace: str = "default"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str | None = None
    """Unique per process; defaults to hostname + a random suffix."""
    health_host: str = "127.0.0.1"
    """Where /healthz, /readyz and /metrics listen: this machine only by default. In a pod, the kubelet probes the
    pod's IP: pass ``"0.0.0.0"`` (what ``kanri run --health-host`` and deploy/operator/operator.yaml do)."""
    health_port: int | None = 8081
    """Serves /healthz, /readyz and /metrics; 0 picks a free port (see ``Manager.health_port``), None disables."""
    metrics_auth: bool = False
    """Serve /metrics only to a bearer token the API server authenticates (TokenReview) and allows ``get`` on the
    non-resource URL /metrics (SubjectAccessReview), as controller-runtime's WithAuthenticationAndAuthorization;
    the client's identity then needs ``create`` on tokenreviews and subjectaccessreviews. /healthz and /readyz
    stay open (the kubelet's probes carry no token)."""
    graceful_shutdown_timeout: float = 30.0
    """How long reconciles in flight may take to finish after a stop is requested."""
    namespace: str | None = None
    """Watch only this namespace (None: all namespaces, or those of ``namespaces``)."""
    namespaces: tuple[str, ...] = ()
    """Watch only these namespaces (one LIST+WATCH per namespace and kind); with ``namespace``, both are watched.
    Empty (and no ``namespace``): all namespaces."""
    watch_timing: WatchTiming | None = None

    def watched_namespaces(self) -> tuple[str, ...] | None:
        """The namespaces watched, in order and without repeats; None for all of them."""
        listed = ((self.namespace,) if self.namespace is not None else ()) + tuple(self.namespaces)
        return tuple(dict.fromkeys(listed)) or None


class Manager:
    """Runs controllers against one cluster.

        Usage::

            async with await Client.from_kubeconfig() as client:
                manager = Manager(client, ManagerOptions(name="widgets"))
                manager.add(Controller("widgets", reconcile, for_kind=WIDGET).owns(CONFIG_MAP))
                await manager.run()          # until SIGTERM/SIGINT (or stop())

        What a reconciler needs comes from the manager: ``manager.cache`` (the shared informer cache: reads from memory,
    see :class:`Cache`), ``manager.client`` (the :class:`Client` it was built with; writes made through it from a
    reconcile are known as that reconcile's own), ``manager.events`` (an :class:`EventRecorder` whose component is the
    manager's name) and ``manager.registry`` (the Prometheus registry /metrics serves).

        Caches run on every replica (a standby has a warm cache); controllers run only on the leader. Losing the lease
        stops every reconcile at once and ``run`` raises ``LeadershipLost`` (exit and let the Deployment restart the
        process, as controller-runtime does). A stop request lets reconciles in flight finish within
        ``graceful_shutdown_timeout``, then releases the lease so a successor starts without waiting for it to expire.
    """

    def __init__(self, client: Client, options: ManagerOptions, *, registry: CollectorRegistry | None = None) -> None:
        self.client = client
        self.options = options
        self.registry = registry if registry is not None else CollectorRegistry()
        self.cache = Cache(client, namespaces=options.watched_namespaces(), timing=options.watch_timing)
        """The informer cache every controller of this manager shares."""
        self.events = EventRecorder(client, component=options.name)
        """Records core/v1 Events about objects (``await manager.events.normal(obj, "Created", "...")``)."""
        client.add_write_listener(self.cache.observe_write)  # reconciles read their own writes
        self._controller_metrics = ControllerMetrics(self.registry)
        self._queue_metrics = WorkQueueMetrics(self.registry)
        self._controllers: list[Controller] = []
        self._runnables: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        self._servers: list[tuple[str, Callable[[], Coroutine[Any, Any, None]], Callable[[], bool] | None]] = []
        self._stop_requested = asyncio.Event()
        self._stopped = asyncio.Event()
        self._running = False
        self._leading = False
        self.health_port: int | None = None
        self.identity = options.identity or default_identity()
        self._metrics_auth = MetricsAuthorizer(client) if options.metrics_auth else None

    def add(self, controller: Controller) -> None:
        """Register a controller (before ``run``)."""
        controller.setup(self.cache, self.client, self._controller_metrics, self._queue_metrics)
        self._controllers.append(controller)

    def add_runnable(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Register leader-only work that is not a controller (before ``run``): ``run()`` is started when the
        controllers start and cancelled once they have stopped (a graceful stop lets reconciles in flight finish
        first), so work it owns — background jobs a reconciler started — ends with the manager, not with the
        process. It should wait until cancelled and clean up then; returning early or raising ends only itself
        (logged)."""
        self._runnables.append((name, run))

    def add_server(
        self, name: str, run: Callable[[], Coroutine[Any, Any, None]], *, ready: Callable[[], bool] | None = None
    ) -> None:
        """Register work every replica runs from the start, leader or not (before ``run``), such as a conversion
        webhook the API server may call on any replica. ``run()`` is cancelled when the manager stops; raising ends
        the manager (a replica that cannot serve should not look healthy). ``ready()``, when given, must also be
        True for /readyz to answer ok."""
        self._servers.append((name, run, ready))

    @property
    def controllers(self) -> list[Controller]:
        return list(self._controllers)

    def stop(self) -> Stopping:
        """Ask for a graceful stop: no new reconciles, in-flight ones finish, the lease is released.

        The request is made at once, so plain ``manager.stop()`` works from synchronous code (a signal handler, a
        test's ``finally``); ``await manager.stop()`` also waits until :meth:`run` has returned (at once if it is not
        running). Never await it from inside one of this manager's reconciles: the stop waits for that reconcile.
        """
        self._stop_requested.set()
        return Stopping(self)

    async def wait_stopped(self) -> None:
        """Return once :meth:`run` has returned (at once when it is not running)."""
        if self._running:
            await self._stopped.wait()

    def ready(self) -> bool:
        """Ready when every informer has synced and every server says ready (leader or standby alike)."""
        return self.cache.synced() and all(ready() for _, _, ready in self._servers if ready is not None)

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until :meth:`stop`, SIGTERM/SIGINT (when ``handle_signals``), or loss of leadership."""
        loop = asyncio.get_running_loop()
        self._running = True
        self._stopped.clear()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        try:
            async with asyncio.TaskGroup() as group:
                background = [group.create_task(self.cache.run(), name="cache")]
                background += [group.create_task(run(), name=f"server {name}") for name, run, _ in self._servers]
                if self.options.health_port is not None:
                    background.append(group.create_task(self._serve_health(), name="health"))
                leading = group.create_task(self._campaign(), name="leader")
                stop = group.create_task(self._stop_requested.wait(), name="stop")
                await asyncio.wait([leading, stop], return_when=asyncio.FIRST_COMPLETED)
                if not leading.done():
                    await self._graceful_stop(leading)
                stop.cancel()
                for task in background:
                    task.cancel()
        except BaseExceptionGroup as errors:
            if len(errors.exceptions) == 1:
                raise errors.exceptions[0] from None
            raise
        finally:
            self._running = False
            self._stopped.set()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
        log.info("manager stopped", manager=self.options.name)

    async def _campaign(self) -> None:
        if not self.options.leader_election:
            await self._lead()
            return
        elector = LeaderElector(
            self.client,
            namespace=self.options.leader_election_namespace,
            name=self.options.name,
            identity=self.identity,
            lease_duration=self.options.lease_duration,
            renew_deadline=self.options.renew_deadline,
            retry_period=self.options.retry_period,
            registry=self.registry,
        )
        await elector.run(self._lead)

    async def _lead(self) -> None:
        """Leader-only work: run every controller until each has stopped."""
        self._leading = True
        log.info("starting controllers", manager=self.options.name, identity=self.identity)
        try:
            async with asyncio.TaskGroup() as group:
                runnables = [group.create_task(self._runnable(name, run), name=f"runnable {name}")
                             for name, run in self._runnables]  # fmt: skip
                controllers = [group.create_task(controller.run(), name=f"controller {controller.name}")
                               for controller in self._controllers]  # fmt: skip
                if controllers:
                    await asyncio.wait(controllers)
                for task in runnables:  # the controllers are done: nothing will hand the runnables more work
                    task.cancel()
        finally:
            self._leading = False

    async def _runnable(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        try:
            await run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("runnable failed", manager=self.options.name, runnable=name)

    async def _graceful_stop(self, leading: asyncio.Task[None]) -> None:
        log.info("stopping: letting reconciles in flight finish", timeout=self.options.graceful_shutdown_timeout)
        for controller in self._controllers:
            controller.stop()
        if not self._leading:
            # A standby (or a leader still waiting for caches) has nothing in flight.
            leading.cancel()
        done, _ = await asyncio.wait([leading], timeout=self.options.graceful_shutdown_timeout)
        if not done:
            log.warning("reconciles did not finish in time; cancelling them")
            leading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leading

    async def _serve_health(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.options.health_host, self.options.health_port)
        await site.start()
        self.health_port = int(runner.addresses[0][1])
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, _: web.Request) -> web.Response:
        if self.ready():
            return web.Response(text="ok")
        return web.Response(status=503, text="caches not synced or a server not ready")

    async def _metrics(self, request: web.Request) -> web.Response:
        if self._metrics_auth is not None:
            verdict = await self._metrics_auth.check(request.headers.get("Authorization"))
            if not verdict.allowed:
                headers = {"WWW-Authenticate": "Bearer"} if verdict.status == 401 else None
                return web.Response(status=verdict.status, text=verdict.reason, headers=headers)
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


class Stopping:
    """What :meth:`Manager.stop` returns: the stop is already requested; awaiting this waits until ``run`` returned."""

    def __init__(self, manager: Manager) -> None:
        self._manager = manager

    def __await__(self) -> Generator[Any, None, None]:
        return self._manager.wait_stopped().__await__()
