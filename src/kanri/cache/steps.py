"""A Cache's steps, free functions of the pass context (kanri.kit.PassContext), in pass order: the password, the
configuration, the Services, the StatefulSet, then what the pods report (roles, routing, failovers, Ready)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from kanri import kit
from kanri import runtime as kr
from kanri.cache import children
from kanri.cache.agent.fencing import History
from kanri.cache.agent.resp import Secret
from kanri.cache.api import CacheSpec, CacheStatus, FailoverRecord, ReadPolicy
from kanri.cache.observe import Assessment, assess, failover_record, pod_routing, probe, recorded_primary
from kanri.cache.rollout import step as rollout
from kanri.runtime.kinds import CONFIG_MAP, POD, ROLE, ROLE_BINDING, SECRET, SERVICE, SERVICE_ACCOUNT, STATEFUL_SET

__all__ = ["LAST_PRIMARY", "STEPS", "label_pods", "spec_of"]

Obj = dict[str, Any]

LOOK_AGAIN = 5.0
"""Seconds between two looks at the pods (Sentinel may fail over at any time, with or without the operator)."""
LAST_PRIMARY: kit.ObjectMemory[dict[str, History]] = kit.ObjectMemory(dict)
"""The primary's history at the operator's last look, by pod name: what a failover's possible loss is measured from."""


def spec_of(ctx: kit.PassContext) -> CacheSpec:
    return CacheSpec.model_validate(ctx.obj.get("spec") or {})


def status_of(ctx: kit.PassContext) -> CacheStatus:
    return CacheStatus.model_validate(ctx.ledger.status or {})


async def write_children(ctx: kit.PassContext) -> kr.Result | None:
    """The password (created once, not owned: deletionPolicy keeps or deletes it), the ConfigMap, the Services, the
    agents' ServiceAccount, Role (exactly the StatefulSet's pods) and RoleBinding, and the StatefulSet, each written
    only when it differs."""
    spec = spec_of(ctx)
    if await ctx.children.create_once(SECRET, children.password_secret(ctx.name), owned=False) == "created":
        await ctx.events.normal(ctx.obj, "PasswordCreated", f"generated Secret {children.password_name(ctx.name)}")
    await ctx.children.apply(CONFIG_MAP, children.config_map(ctx.name, spec))
    for service in children.services(ctx.name):
        await ctx.children.apply(SERVICE, service)
    replicas = rollout.statefulset_replicas(spec, status_of(ctx).current_primary)
    # before the StatefulSet: a new pod's agent may label itself from its first second
    await ctx.children.apply(SERVICE_ACCOUNT, children.agent_service_account(ctx.name))
    await ctx.children.apply(ROLE, children.agent_role(ctx.name, replicas))
    await ctx.children.apply(ROLE_BINDING, children.agent_role_binding(ctx.name))
    made = kit.claim_template_size(ctx.cache.get(STATEFUL_SET, ctx.name, ctx.namespace))
    await ctx.children.apply(STATEFUL_SET, children.statefulset(ctx.name, spec, replicas, made))
    if spec.storage is not None:  # a bigger size grows the claims themselves: the template cannot change
        resizing = await kit.grow_claims(ctx, spec.storage.size, "docs/cache.md#volumes")
        ctx.ledger.stage("resizingVolumes", resizing or None)
    return None


async def _observe(ctx: kit.PassContext, password: Secret) -> tuple[dict[str, History | None], dict[str, int | None]]:
    addresses = kit.pod_addresses(ctx.cache, ctx.labels, ctx.obj)
    names = sorted(addresses)
    answers = await asyncio.gather(*(probe(addresses[name], password) for name in names))
    histories = {name: answer[0] for name, answer in zip(names, answers, strict=True)}
    return histories, {name: answer[1] for name, answer in zip(names, answers, strict=True)}


async def label_pods(client: kr.Client, namespace: str, pods: Iterable[Obj], seen: Assessment,
                     histories: Mapping[str, History | None], policy: ReadPolicy) -> None:  # fmt: skip
    """The role and readable labels ``-rw`` and ``-ro`` select, from what each pod reported (a silent pod keeps
    none: it leaves both Services), and the read bound its agent enforces (:func:`~kanri.cache.observe.pod_routing`).
    Each pod's agent keeps its own role label the same way (:mod:`kanri.cache.agent.labels`), so ``-rw`` follows a
    failover while the operator is down, and withdraws its pod from ``-ro`` past the bound
    (:mod:`kanri.cache.agent.readable`); this pass covers a pod whose agent cannot, and alone adds pods to ``-ro``."""
    for pod in pods:
        name = pod["metadata"]["name"]
        patch = pod_routing(pod, histories.get(name), seen, policy)
        if patch is None:
            continue
        try:
            await client.patch(POD, name, {"metadata": patch}, namespace)
        except kr.ApiError as exc:
            # not found: deleted since the cache saw it, nothing to route; a conflict: written since (its agent may
            # have withdrawn it from -ro), the next look routes it from the pod as it is now
            if not (exc.not_found or exc.conflict):
                raise


async def _record_failover(ctx: kit.PassContext, status: CacheStatus, seen: Assessment,
                           histories: dict[str, History | None]) -> list[FailoverRecord]:  # fmt: skip
    """A primary other than the one on record is a failover (Sentinel's, perhaps while the operator was down)."""
    records = list(status.failovers)
    before = status.current_primary
    if seen.primary is None or before is None or seen.primary == before:
        return records
    after = histories[seen.primary]
    assert after is not None
    record = failover_record(before, LAST_PRIMARY.of(ctx.obj).get(before), seen.primary, after, datetime.now(UTC))
    loss = "unknown" if record.possible_loss_bytes is None else f"{record.possible_loss_bytes} bytes"
    await ctx.events.warning(ctx.obj, "FailedOver", f"primary moved from {before} to {seen.primary}; writes not "
                             f"confirmed by WAIT that may be lost: {loss}")  # fmt: skip
    return [*records, record][-20:]


def _readiness(spec: CacheSpec, seen: Assessment, answered: int) -> tuple[bool, str, str]:
    if len(seen.primaries) > 1:
        return False, "SeveralPrimaries", f"{len(seen.primaries)} pods claim to be primary: {', '.join(seen.primaries)}"
    if seen.primary is None:
        return False, "NoPrimary", f"{answered} of {spec.replicas} pods answered and none is the primary yet"
    if seen.ahead:
        held = ", ".join(f"{pod} ({'an unmeasurable gap' if n is None else f'{n} bytes'})"
                         for pod, n in seen.ahead.items())  # fmt: skip
        return (
            False,
            "ReplicaAheadOfPrimary",
            (
                f"the primary {seen.primary} lacks replicated writes that {held} hold(s): a client may have been told "
                f"they were replicated (WAIT), so these replicas refuse to re-sync from it and ask Sentinel to promote "
                f"the one holding the most; until then reads from {seen.primary} miss them"
            ),
        )
    if len(seen.linked) < spec.replicas - 1:
        return False, "ReplicasNotLinked", f"{len(seen.linked)} of {spec.replicas - 1} replicas replicate from " \
                                           f"{seen.primary}"  # fmt: skip
    return True, "Replicating", f"{seen.primary} is the primary; {len(seen.linked)} replicas linked"


def _ready_reason(status: CacheStatus) -> str | None:
    return next((c.reason for c in status.conditions if c.type == "Ready"), None)


async def observe_pods(ctx: kit.PassContext) -> kr.Result | None:
    """Read every pod's role and history, route the Services, record a failover, and say whether it is Ready."""
    ctx.requeue(LOOK_AGAIN)
    spec, status = spec_of(ctx), status_of(ctx)
    # wrapped at once: a traceback's locals (the console log renders them) never hold the text
    found = kit.secret_token(ctx.cache, ctx.namespace, children.password_name(ctx.name), children.PASSWORD_KEY)
    password, found = (Secret(found) if found else None), None
    if password is None:
        ctx.ledger.stage("phase", "Pending")
        ctx.ledger.condition("Ready", False, "Provisioning", "the password Secret is not in the cache yet")
        return None
    histories, io_seconds = await _observe(ctx, password)
    former = status.failovers[-1].from_pod if status.failovers else None
    seen = assess(histories, io_seconds, spec.read_policy, former)
    pods = ctx.cache.list(POD, ctx.namespace, ctx.labels.selector(ctx.name))
    await label_pods(ctx.client, ctx.namespace, pods, seen, histories, spec.read_policy)
    failovers = await _record_failover(ctx, status, seen, histories)
    lead = histories.get(seen.primary) if seen.primary else None
    if seen.primary is not None and lead is not None:
        LAST_PRIMARY.of(ctx.obj)[seen.primary] = lead
    answered = sum(1 for history in histories.values() if history is not None)
    ready, reason, message = _readiness(spec, seen, answered)
    if reason == "ReplicaAheadOfPrimary" and _ready_reason(status) != reason:  # once per occurrence
        await ctx.events.warning(ctx.obj, reason, message)
    ctx.ledger.condition("Ready", ready, reason, message)
    primary = recorded_primary(seen, status.current_primary)
    planned = await rollout.roll(ctx, spec, seen, password)
    if planned is not None:  # a planned switchover: recorded here, so the next look sees no unexplained failover
        failovers, primary = [*failovers, planned][-20:], planned.to_pod
    fields: dict[str, Any] = {
        "phase": "Ready" if ready else ("Provisioning" if status.current_primary is None else "Degraded"),
        "currentPrimary": primary,
        "writablePrimaries": seen.primaries,
        "readyReplicas": len(seen.linked),
        "readableReplicas": [name for name in seen.readable if name != seen.primary],
        "failovers": [record.model_dump(mode="json", by_alias=True, exclude_none=True) for record in failovers],
    }
    for key, value in fields.items():
        ctx.ledger.stage(key, value)
    return None


STEPS: tuple[kit.Step, ...] = (write_children, observe_pods)
