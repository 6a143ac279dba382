"""A controller: watches kinds, maps every change to a primary object's key, and reconciles keys with workers.

The reconciler sees only a :class:`Request` (namespace/name), never the event: it reads the latest state from the
cache, which is what makes the loop level-triggered. How a reconcile ended decides what happens next:

| outcome | next |
|---|---|
| returns ``None`` / ``Result()`` | backoff forgotten; nothing until the next change or resync |
| returns ``Result(requeue_after=s)`` | backoff forgotten; looked at again in ``s`` seconds |
| raises :class:`PermanentError`, or an API 422 | not retried until ``metadata.generation`` changes; reason written to a
condition, which the runtime removes again after the next successful reconcile |
| raises anything else (incl. timeout) | retried with per-key exponential backoff; the traceback is logged once,
repeats of the same error as one line with a count (at 2, 4, 8, ... repeats) |

An exception never kills a worker.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, cast

import structlog

from kanri.runtime._cache import Cache
from kanri.runtime._client import Client, Write, recorded_writes
from kanri.runtime._conditions import get_condition, set_condition
from kanri.runtime._controller_metrics import ControllerMetrics
from kanri.runtime._echo import Echoes
from kanri.runtime._errors import ApiError, PermanentError
from kanri.runtime._informer import Event
from kanri.runtime._kinds import Kind
from kanri.runtime._queue import Priority, QueueShutDown, Request, WorkQueue
from kanri.runtime._queue_metrics import WorkQueueMetrics
from kanri.runtime._ratelimit import ExponentialBackoff, MaxOfRateLimiter, TokenBucket
from kanri.runtime._status_schema import read_conditions_problem

Obj = dict[str, Any]
log = structlog.get_logger("kanri.controller")

_PERMANENT_REPORT_ATTEMPTS = 3  # a fresh read usually wins the next try; more only under heavy write traffic
_INVALID = 422  # the API server refused an object as invalid: retrying the same object cannot succeed
_SCHEMA_CHECK_TIMEOUT = 10.0  # the start-up check of the CRD is advice: never hold the workers back for long


@dataclass(frozen=True)
class Result:
    """What a successful reconcile asks for: nothing, or another look after ``requeue_after`` seconds."""

    requeue_after: float | None = None


class Reconciler(Protocol):
    """The whole user contract: make the world match the object named by ``request``."""

    async def reconcile(self, request: Request) -> Result | None: ...


ReconcileFunc = Callable[[Request], Awaitable[Result | None]]
Mapper = Callable[[Obj], Iterable[Request]]


@dataclass(frozen=True)
class ControllerOptions:
    """Tuning of one controller; defaults follow controller-runtime where it has one."""

    max_concurrent_reconciles: int = 1
    reconcile_timeout: float = 300.0
    resync_period: float | None = 600.0
    """Every primary key is looked at again this often (jittered +-10%, at background priority); None disables."""
    backoff_base: float = 0.005
    backoff_max: float = 1000.0
    qps: float = 10.0
    burst: int = 100
    permanent_error_condition: str | None = "Ready"
    """Condition type set False with the error's reason on a PermanentError (None: leave status alone). The runtime
    writes it under its own field manager (``kanri.runtime/<controller name>``) and removes it after the next
    successful reconcile, unless the reconciler has written that condition since (then it is the reconciler's)."""
    log_name_key: str | None = None
    """Another log key for the object's name, beside ``name`` (PostgreSQL operator: ``cluster``, its metrics' label)."""


class Controller:
    """Reconciles objects of ``for_kind``; build with :meth:`owns` and :meth:`watches`, then add to a Manager."""

    def __init__(
        self,
        name: str,
        reconciler: Reconciler | ReconcileFunc,
        *,
        for_kind: Kind,
        options: ControllerOptions | None = None,
    ) -> None:
        self.name = name
        self.for_kind = for_kind
        self.options = options or ControllerOptions()
        if self.options.max_concurrent_reconciles < 1:
            raise ValueError("max_concurrent_reconciles must be at least 1")
        method = getattr(reconciler, "reconcile", None)
        self._reconcile = cast(ReconcileFunc, method if method is not None else reconciler)
        self._owned: list[Kind] = []
        self._mapped: list[tuple[Kind, Mapper]] = []
        self._queue: WorkQueue | None = None
        # Keys whose last reconcile failed permanently, with the generation that failed.
        self._failed_generation: dict[Request, int] = {}
        # Our own writes' watch events queue nothing (see kanri.runtime._echo for the rule).
        self._echoes = Echoes()
        # Keys failing with a retried error: that error's text and how many times in a row (for quieter logs).
        self._failures: dict[Request, tuple[str, int]] = {}
        self.field_manager = f"kanri.runtime/{name}"
        """The field manager of the status condition the runtime writes after a permanent failure."""

    def owns(self, kind: Kind) -> Controller:
        """Changes to ``kind`` objects controlled by a primary object (ownerReference with controller=true) queue it."""
        self._owned.append(kind)
        return self

    def watches(self, kind: Kind, mapper: Mapper) -> Controller:
        """Changes to ``kind`` objects queue whatever keys ``mapper`` returns."""
        self._mapped.append((kind, mapper))
        return self

    @property
    def kinds(self) -> list[Kind]:
        return [self.for_kind, *self._owned, *(kind for kind, _ in self._mapped)]

    @property
    def queue(self) -> WorkQueue:
        if self._queue is None:
            raise RuntimeError(f"controller {self.name} is not set up; add it to a Manager")
        return self._queue

    # --- wiring (called by the Manager) ----------------------------------------------------------------------------

    def setup(self, cache: Cache, client: Client, metrics: ControllerMetrics, queue_metrics: WorkQueueMetrics) -> None:
        """Create the queue and connect informers to it. Events queue keys even before workers start (a standby
        replica keeps a warm queue and cache, so taking over is fast)."""
        limiter = MaxOfRateLimiter(
            ExponentialBackoff(self.options.backoff_base, self.options.backoff_max),
            TokenBucket(self.options.qps, self.options.burst),
        )
        self._queue = WorkQueue(self.name, rate_limiter=limiter, metrics=queue_metrics)
        self._cache = cache
        self._client = client
        self._metrics = metrics
        metrics.max_concurrent.labels(self.name).set(self.options.max_concurrent_reconciles)
        # Every reconcile series exists from the start at 0, as controller-runtime's do: rates and error ratios read
        # 0 rather than "no data" until something happens.
        for result in ("success", "error", "requeue_after"):
            metrics.reconcile_total.labels(self.name, result)
        metrics.reconcile_errors.labels(self.name)
        metrics.terminal_errors.labels(self.name)
        metrics.watch_deletions(self.name, cache.store(self.for_kind))
        cache.informer(self.for_kind).add_handler(self._on_primary)
        for kind in self._owned:
            cache.informer(kind).add_handler(self._owned_handler(kind))
        for kind, mapper in self._mapped:
            cache.informer(kind).add_handler(self._mapped_handler(kind, mapper))

    def _offer(self, kind: Kind, event: Event, requests: Iterable[Request]) -> None:
        """Queue the keys an event maps to, unless it is only the echo of that key's own reconcile's write."""
        if event.from_list:  # a (re)list is also a chance to look again: never filtered
            self._echoes.forget(kind, event)
            for request in requests:
                self.queue.add(request, Priority.BACKGROUND)
            return
        for request in self._echoes.to_queue(kind, event, requests):
            self.queue.add(request, Priority.LIVE)

    def _on_primary(self, event: Event) -> None:
        meta = event.obj["metadata"]
        request = Request(meta.get("namespace") or "", meta["name"])
        if event.type == "DELETED":
            self._failed_generation.pop(request, None)
            self._failures.pop(request, None)
        self._offer(self.for_kind, event, (request,))

    def _owned_handler(self, kind: Kind) -> Callable[[Event], None]:
        def handle(event: Event) -> None:
            owners: dict[Request, None] = {}  # ordered and deduplicated (obj and old usually name the same owner)
            for obj in (event.obj, event.old):
                if obj is None:
                    continue
                for ref in obj["metadata"].get("ownerReferences") or ():
                    if (
                        ref.get("controller")
                        and ref.get("kind") == self.for_kind.kind
                        and (ref.get("apiVersion", "").rpartition("/")[0] == self.for_kind.group)
                    ):
                        owners[Request(obj["metadata"].get("namespace") or "", ref["name"])] = None
            self._offer(kind, event, owners)

        return handle

    def _mapped_handler(self, kind: Kind, mapper: Mapper) -> Callable[[Event], None]:
        def handle(event: Event) -> None:
            self._offer(kind, event, dict.fromkeys(mapper(event.obj)))

        return handle

    def _delivered(self, write: Write) -> str | None:
        """The resourceVersion the watch last delivered for a written object (None: a kind this controller does not
        watch)."""
        if write.kind not in self.kinds:
            return None
        informer = self._cache.informer_of(write.kind)
        if informer is None or (write.kind.namespaced and not informer.covers(write.namespace)):
            return None  # no event of it will come (a namespace the manager does not watch): expect none
        latest = informer.watched(write.namespace if write.kind.namespaced else "", write.name)
        return str(latest["metadata"].get("resourceVersion", "")) if latest is not None else ""

    # --- running ---------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Wait for the caches, then reconcile with ``max_concurrent_reconciles`` workers until the queue shuts down.

        Every informer of the cache must have synced, not only this controller's: a reconcile may read the kinds the
        manager's other controllers declared, and must not find them empty because their first list is not in yet."""
        await self._cache.wait_for_sync(self.kinds)
        await self._cache.wait_for_sync()
        await self._check_status_schema()
        log.info("controller started", controller=self.name, workers=self.options.max_concurrent_reconciles)
        async with asyncio.TaskGroup() as group:
            resync = group.create_task(self._resync_loop(), name=f"{self.name} resync")
            workers = [
                group.create_task(self._worker(), name=f"{self.name} worker {i}")
                for i in range(self.options.max_concurrent_reconciles)
            ]
            await asyncio.gather(*workers)
            resync.cancel()
        log.info("controller stopped", controller=self.name)

    async def _check_status_schema(self) -> None:
        """Warn (once per start) when the primary kind's CRD would prune the permanent-error condition: the reason a
        user must read would otherwise vanish without a trace (see kanri.runtime._status_schema for why a warning)."""
        if self.options.permanent_error_condition is None:
            return
        try:
            async with asyncio.timeout(_SCHEMA_CHECK_TIMEOUT):
                problem = await read_conditions_problem(self._client, self.for_kind)
        except Exception as exc:  # advice only: a failed check must not stop the controller
            log.debug("could not check the status schema", controller=self.name, error=str(exc))
            return
        if problem is not None:
            log.warning("permanent errors will not show in status", controller=self.name,
                        condition=self.options.permanent_error_condition, problem=problem)  # fmt: skip

    def stop(self) -> None:
        """Stop handing out keys; reconciles in flight finish, then :meth:`run` returns."""
        self.queue.shutdown(drain=False)

    async def _resync_loop(self) -> None:
        period = self.options.resync_period
        if period is None:
            return
        store = self._cache.store(self.for_kind)
        while True:
            await asyncio.sleep(period * random.uniform(0.9, 1.1))
            for namespace, name in store.object_keys():
                self.queue.add(Request(namespace, name), Priority.BACKGROUND)

    async def _worker(self) -> None:
        while True:
            try:
                request = await self.queue.get()
            except QueueShutDown:
                return
            self._metrics.active_workers.labels(self.name).inc()
            token = recorded_writes.set(self._echoes.start(request))
            try:
                await self._process(request)
            finally:
                recorded_writes.reset(token)
                if self._echoes.finish(request, self._delivered):
                    self.queue.add(request, Priority.LIVE)  # before done(): the key comes back once it is released
                self._metrics.active_workers.labels(self.name).dec()
                self.queue.done(request)

    async def _process(self, request: Request) -> None:
        obj = self._cache.get(self.for_kind, request.name, request.namespace)
        meta = obj["metadata"] if obj is not None else {}
        generation = int(meta.get("generation", 0))
        failed = self._failed_generation.get(request)
        if failed is not None and obj is not None and generation == failed:
            return  # permanent failure at this generation: wait for the user to change the object
        self._failed_generation.pop(request, None)
        context = {
            "controller": self.name,
            "namespace": request.namespace,
            "name": request.name,
            "uid": meta.get("uid"),
            "generation": generation,
            # A log correlation id, not a secret: random, not secrets (one getrandom syscall per reconcile).
            "reconcile_id": f"{random.getrandbits(64):016x}",
        }
        if self.options.log_name_key:
            context[self.options.log_name_key] = request.name
        with structlog.contextvars.bound_contextvars(**context):
            started = time.monotonic()
            result_label = "success"
            try:
                async with asyncio.timeout(self.options.reconcile_timeout):
                    result = await self._reconcile(request)
            except PermanentError as exc:
                result_label = "error"
                log.warning("reconcile failed permanently", reason=exc.reason, error=exc.message)
                await self._fail_permanently(request, obj, generation, exc)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                result_label = "error"
                if isinstance(exc, ApiError) and exc.status == _INVALID:
                    # The API server refused what the reconcile built from this object (a child made from the
                    # user's spec, most often): the same object would be refused again, so this is terminal.
                    log.warning("reconcile failed: the API server refused an object as invalid", error=str(exc))
                    invalid = PermanentError(exc.reason or "Invalid", exc.message or str(exc))
                    await self._fail_permanently(request, obj, generation, invalid)
                else:
                    self._metrics.reconcile_errors.labels(self.name).inc()
                    self.queue.add_rate_limited(request)
                    self._log_retried(request, exc)
            else:
                self.queue.forget(request)
                self._recovered(request)
                if result is not None and result.requeue_after is not None:
                    result_label = "requeue_after"
                    self.queue.add_after(request, result.requeue_after)
                await self._clear_permanent(request)
            finally:
                self._metrics.reconcile_time.labels(self.name).observe(time.monotonic() - started)
            self._metrics.reconcile_total.labels(self.name, result_label).inc()
            log.debug("reconciled", result=result_label, seconds=round(time.monotonic() - started, 3))

    def _log_retried(self, request: Request, exc: Exception) -> None:
        """Log an error that will be retried: a traceback the first time, then one line at 2, 4, 8, ... repeats."""
        if isinstance(exc, ApiError) and exc.conflict:
            # Someone changed the object under us: routine, retried from the fresh cache.
            log.info("reconcile hit a conflict; retrying", error=str(exc))
            return
        if isinstance(exc, TimeoutError):
            log.warning("reconcile timed out; retrying", timeout=self.options.reconcile_timeout)
            return
        text = f"{type(exc).__name__}: {exc}"
        previous, count = self._failures.get(request, ("", 0))
        if previous != text:
            self._failures[request] = (text, 1)
            log.exception("reconcile failed; retrying", retries=self.queue.num_requeues(request))
            return
        count += 1
        self._failures[request] = (text, count)
        if count & (count - 1) == 0:
            log.error("reconcile failed again with the same error; retrying", error=text, repeats=count)

    def _recovered(self, request: Request) -> None:
        failed = self._failures.pop(request, None)
        if failed is not None:
            log.info("reconcile succeeded after failing", failures=failed[1])

    async def _fail_permanently(self, request: Request, obj: Obj | None, generation: int, exc: PermanentError) -> None:
        """Not retried at this generation; the reason goes to the object's status."""
        self._metrics.terminal_errors.labels(self.name).inc()
        self._metrics.reconcile_errors.labels(self.name).inc()
        self._failed_generation[request] = generation
        self._failures.pop(request, None)
        self.queue.forget(request)
        await self._report_permanent(obj, exc)

    async def _clear_permanent(self, request: Request) -> None:
        """After a successful reconcile, remove the condition a permanent failure made the runtime write.

        Only a condition the runtime still owns is removed (its ``reason`` is in the managedFields entry of the
        runtime's field manager and of no other): a reconciler that wrote that condition type since, even with the
        same status, made it its own, and the runtime leaves it alone. A 409 means the cached view was stale: the
        object is read again and the check made anew."""
        condition_type = self.options.permanent_error_condition
        if condition_type is None:
            return
        obj = self._cache.get(self.for_kind, request.name, request.namespace)
        for attempt in range(_PERMANENT_REPORT_ATTEMPTS):
            if obj is None or not _runtime_wrote(obj, self.field_manager, condition_type):
                return
            conditions = (obj.get("status") or {}).get("conditions") or []
            kept = [condition for condition in conditions if condition.get("type") != condition_type]
            patch = {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                "status": {"conditions": kept},
            }
            try:
                await self._client.patch_status(
                    self.for_kind, request.name, patch, request.namespace or None, field_manager=self.field_manager
                )
                log.info("removed the condition of an earlier permanent failure", condition=condition_type)
                return
            except ApiError as error:
                if not error.conflict or attempt + 1 == _PERMANENT_REPORT_ATTEMPTS:
                    log.warning("could not remove the condition of an earlier permanent failure",
                                status=error.status, error=error.message)  # fmt: skip
                    return
            try:
                obj = await self._client.get(self.for_kind, request.name, request.namespace or None)
            except ApiError as error:
                log.warning("could not read the object again to clear its permanent error", status=error.status)
                return

    async def _report_permanent(self, obj: Obj | None, exc: PermanentError) -> None:
        """Put a permanent failure's reason where the user looks: a False condition on the object's status.

        ``obj`` is what the cache held before the reconcile, and the reconcile may have written the object since
        (a finalizer added first is the usual case): a 409 on the guarded patch means exactly that, so the object
        is read again from the API and the condition computed anew on it — never dropped."""
        condition_type = self.options.permanent_error_condition
        if obj is None or condition_type is None:
            return
        name, namespace = obj["metadata"]["name"], obj["metadata"].get("namespace")
        for attempt in range(_PERMANENT_REPORT_ATTEMPTS):
            conditions = copy.deepcopy((obj.get("status") or {}).get("conditions") or [])
            changed = set_condition(
                conditions,
                type=condition_type,
                status="False",
                reason=exc.reason,
                message=exc.message,
                observed_generation=int(obj["metadata"].get("generation", 0)),
                now=datetime.now(UTC),
            )
            if not changed:
                return
            patch = {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                "status": {"conditions": conditions},
            }
            try:
                written = await self._client.patch_status(
                    self.for_kind, name, patch, namespace, field_manager=self.field_manager
                )
            except ApiError as error:
                if not error.conflict or attempt + 1 == _PERMANENT_REPORT_ATTEMPTS:
                    gone = "the object is gone, or its kind has no status subresource"
                    hint = {"hint": gone} if error.not_found else {}
                    log.warning("could not record the permanent error in status", reason=exc.reason,
                                status=error.status, error=error.message, **hint)  # fmt: skip
                    return
            else:
                if get_condition((written.get("status") or {}).get("conditions"), condition_type) is None:
                    # Accepted, then pruned by the CRD's schema: say so, as nobody will find it in status.
                    log.warning("the API server dropped the permanent error's condition: the CRD's status has no "
                                "conditions (see docs/runtime.md)", condition=condition_type, reason=exc.reason,
                                error=exc.message)  # fmt: skip
                return
            try:
                obj = await self._client.get(self.for_kind, name, namespace)
            except ApiError as error:
                log.warning("could not read the object again to record its permanent error", status=error.status)
                return


def _runtime_wrote(obj: Obj, manager: str, condition_type: str) -> bool:
    """Whether ``manager`` (the runtime's) is the only writer of the condition of ``condition_type``'s reason, per
    ``managedFields``. A list-map ``conditions`` names each entry (``k:{"type":"Ready"}``); an atomic list is owned
    whole (``f:conditions: {}``)."""
    conditions = (obj.get("status") or {}).get("conditions") or ()
    if not any(condition.get("type") == condition_type for condition in conditions):
        return False
    key = "k:" + json.dumps({"type": condition_type}, separators=(",", ":"))
    ours = False
    for entry in obj["metadata"].get("managedFields") or ():
        fields = ((entry.get("fieldsV1") or {}).get("f:status") or {}).get("f:conditions")
        if fields is None:
            continue
        owns = not fields or "f:reason" in (fields.get(key) or {})
        if entry.get("manager") == manager:
            ours = ours or owns
        elif owns:
            return False
    return ours
