"""The DatabaseInstance reconciler: loads the object, resolves its class (guardrails, capabilities, the provider
behind its request budget), and runs the pass (kanri.cloud.sync.instance) or the deletion (kanri.cloud.deletion.steps).

No call waits: a spent budget, a throttled or failing provider, an operation under way all end the pass with a
condition and a requeue-after, so one provider's outage never holds a worker another namespace needs."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from pydantic import ValidationError

from kanri import kit
from kanri import runtime as kr
from kanri.cloud import conditions
from kanri.cloud.api import CLASS, INSTANCE, DatabaseClassSpec, DatabaseInstanceSpec
from kanri.cloud.budget.buckets import Budgets
from kanri.cloud.budget.gateway import BudgetSpent, Gateway
from kanri.cloud.context import CloudContext, PollMemory
from kanri.cloud.deletion import steps as deletion
from kanri.cloud.metrics import CloudMetrics
from kanri.cloud.names import FIELD_MANAGER, FINALIZER, LABELS
from kanri.cloud.policy import capability, guardrails
from kanri.cloud.providers import registry
from kanri.cloud.providers.base import Provider, ProviderError, ProviderSetup, Retryable, UserMustFix
from kanri.cloud.sync import instance
from kanri.cloud.sync.desired import desired_of
from kanri.runtime.kinds import SECRET

__all__ = ["DatabaseInstanceReconciler", "controller"]

Obj = dict[str, Any]
_RETRY = 15.0  # a retryable provider error: look again soon (the queue's own backoff applies on exceptions only)


class Unresolved(Exception):
    """The pass cannot go on: ``reason``/``message`` for both conditions (the user or platform team must act)."""

    def __init__(self, reason: str, message: str, *, retry: float | None = None) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry = reason, message, retry


class DatabaseInstanceReconciler:
    def __init__(self, manager: kr.Manager, *, registry: CollectorRegistry = REGISTRY,
                 budgets: Budgets | None = None, poll_scale: float = 1.0) -> None:  # fmt: skip
        self.cache, self.client = manager.cache, manager.client
        self.events = kr.EventRecorder(self.client, component=FIELD_MANAGER)
        self.metrics = CloudMetrics(registry)
        self.budgets = budgets or Budgets()
        self.poll = kit.ObjectMemory(lambda: PollMemory(scale=poll_scale))
        self._providers: dict[str, tuple[str, Provider]] = {}

    async def reconcile(self, request: kr.Request) -> kr.Result | None:
        obj = self.cache.get(INSTANCE, request.name, request.namespace)
        if obj is None:
            self.poll.drop(request.namespace, request.name)
            return None
        return await kit.finalize(self.client, INSTANCE, obj, FINALIZER, apply=self.apply, cleanup=self.cleanup)

    def _pass(self, obj: Obj) -> kit.ObjectPass:
        return kit.ObjectPass(client=self.client, cache=self.cache, events=self.events, kind=INSTANCE, obj=obj,
                              labels=LABELS, field_manager=FIELD_MANAGER)  # fmt: skip

    async def apply(self, obj: Obj) -> kr.Result | None:
        ctx = self._pass(obj)
        try:
            c = await self._context(ctx, for_deletion=False)
            result = await instance.converge(c)
        except Unresolved as stop:
            conditions.user_must_fix(ctx.ledger, stop.reason, stop.message)
            result = kr.Result(requeue_after=stop.retry) if stop.retry else None
        except (BudgetSpent, ProviderError) as error:
            result = self._provider_trouble(ctx, error)
        if result is not None and result.requeue_after is not None:
            ctx.requeue(result.requeue_after)
        return await ctx.finish()

    async def cleanup(self, obj: Obj) -> kr.Result | None:
        ctx = self._pass(obj)
        spec = obj.get("spec") or {}
        observe_only = spec.get("managementPolicy") == "ObserveOnly"
        result: kr.Result | None = None
        try:
            if kit.deletion_policy(obj) == "Retain" or observe_only:
                why = "managementPolicy ObserveOnly" if observe_only else "deletionPolicy Retain"
                try:
                    release = await self._context(ctx, for_deletion=True)
                except (Unresolved, ProviderError):
                    release = None  # no class or provider any more: nothing to release the database from
                await deletion.retain(ctx, release, why=why)
            else:
                result = await deletion.delete(await self._context(ctx, for_deletion=True))
        except Unresolved as stop:
            conditions.user_must_fix(ctx.ledger, stop.reason, f"cannot delete: {stop.message}")
            result = kr.Result(requeue_after=stop.retry or 60.0)
        except (BudgetSpent, ProviderError) as error:
            result = self._provider_trouble(ctx, error)
        if result is None:
            # Done: no status write, which would move the resourceVersion that kit.finalize's guarded removal of
            # the finalizer is made against (a 409, and the whole cleanup again); the object is about to go.
            return None
        if result.requeue_after is not None:
            ctx.requeue(result.requeue_after)
        return await ctx.finish()

    def _provider_trouble(self, ctx: kit.ObjectPass, error: BudgetSpent | ProviderError) -> kr.Result:
        if isinstance(error, BudgetSpent):
            conditions.budget_spent(ctx.ledger, error)
            return kr.Result(requeue_after=error.wait)
        conditions.provider_error(ctx.ledger, error)
        return kr.Result(requeue_after=_RETRY if isinstance(error, Retryable) else 300.0)

    async def _context(self, ctx: kit.ObjectPass, *, for_deletion: bool) -> CloudContext:
        """The typed spec, the class (guardrails and capabilities checked unless deleting) and its provider."""
        try:
            spec = DatabaseInstanceSpec.model_validate(ctx.obj.get("spec") or {})
        except ValidationError as error:
            raise Unresolved("InvalidSpec", str(error).replace("\n", " ")[:500]) from None
        found = self.cache.get(CLASS, spec.class_name)
        if found is None:
            raise Unresolved("ClassNotFound", f"DatabaseClass {spec.class_name} does not exist", retry=60.0)
        cls = DatabaseClassSpec.model_validate(found.get("spec") or {})
        ctx.ledger.stage("provider", cls.provider)
        if not for_deletion:
            _check(ctx, spec, cls)
        provider = await self._provider(spec.class_name, found, cls)
        if not for_deletion:
            _check_capabilities(ctx, spec, provider)
        gateway = Gateway(provider, self.budgets, self.metrics, rate=cls.request_budget.requests_per_second,
                          burst=cls.request_budget.burst)  # fmt: skip
        return CloudContext(ctx=ctx, spec=spec, cls=cls, class_name=spec.class_name, gateway=gateway,
                            desired=desired_of(ctx.obj, spec, cls), metrics=self.metrics,
                            poll=self.poll.of(ctx.obj))  # fmt: skip

    async def _provider(self, name: str, found: Obj, cls: DatabaseClassSpec) -> Provider:
        """The class's provider, built again only when the class changed."""
        version = str(found["metadata"].get("resourceVersion"))
        known = self._providers.get(name)
        if known is not None and known[0] == version:
            return known[1]
        credentials = await self._credentials(cls)
        try:
            built = registry.build(ProviderSetup(class_name=name, spec=cls, credentials=credentials,
                                                 client=self.client))  # fmt: skip
        except UserMustFix as error:
            raise Unresolved(error.reason, error.message) from None
        self._providers[name] = (version, built)
        return built

    async def _credentials(self, cls: DatabaseClassSpec) -> Mapping[str, str] | None:
        ref = cls.aws.credentials_secret if cls.aws is not None else None
        if ref is None:
            return None
        try:
            secret = await self.client.get(SECRET, ref.name, ref.namespace)
        except kr.ApiError as error:
            if error.not_found:
                raise Unresolved("CredentialsNotFound", f"Secret {ref.namespace}/{ref.name} does not exist",
                                 retry=60.0) from None  # fmt: skip
            raise
        data = secret.get("data") or {}
        return {key: base64.b64decode(value).decode() for key, value in data.items()}


def _check(ctx: kit.ObjectPass, spec: DatabaseInstanceSpec, cls: DatabaseClassSpec) -> None:
    violations = guardrails.check(spec, cls)
    if violations:
        rules = ", ".join(v.rule for v in violations)
        ctx.ledger.condition("Ready", False, "GuardrailViolated", "; ".join(v.message for v in violations))
        raise Unresolved("GuardrailViolated", f"outside the class's guardrails ({rules}): "
                         + "; ".join(v.message for v in violations))  # fmt: skip


def _check_capabilities(ctx: kit.ObjectPass, spec: DatabaseInstanceSpec, provider: Provider) -> None:
    fields = capability.unsupported(spec, provider.name, provider.capabilities())
    ctx.ledger.stage("unsupported", fields)
    if not fields:
        ctx.ledger.condition("Unsupported", False, "AllSupported", f"provider {provider.name} honours every field set")
        return
    message = f"provider {provider.name} cannot honour {', '.join(fields)}: unset them or use another class"
    ctx.ledger.condition("Unsupported", True, "UnsupportedField", message)
    raise Unresolved("UnsupportedField", message)


def controller(manager: kr.Manager, *, registry: CollectorRegistry = REGISTRY, budgets: Budgets | None = None,
               options: kr.ControllerOptions | None = None, poll_scale: float = 1.0) -> kr.Controller:  # fmt: skip
    """The DatabaseInstance controller: its connection Secrets (kept data, no owner) map back by label; a class's
    change queues every instance naming it."""
    reconciler = DatabaseInstanceReconciler(manager, registry=registry, budgets=budgets, poll_scale=poll_scale)

    def instances_of(found: Mapping[str, Any]) -> list[kr.Request]:
        name = (found.get("metadata") or {}).get("name")
        return [kr.Request(o["metadata"].get("namespace") or "", o["metadata"]["name"])
                for o in manager.cache.list(INSTANCE) if (o.get("spec") or {}).get("className") == name]  # fmt: skip

    # Several workers: a provider call runs in a thread and the pass awaits it, so a hanging endpoint holds the
    # worker of its own instance for up to the SDK's timeout, never the only one (tenant fairness).
    options = options or kr.ControllerOptions(max_concurrent_reconciles=8)
    built = kr.Controller("databaseinstance", reconciler, for_kind=INSTANCE, options=options)
    return built.watches(SECRET, LABELS.owner_requests).watches(CLASS, instances_of)
