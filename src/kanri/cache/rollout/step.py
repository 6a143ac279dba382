"""The rollout's thin step: read the StatefulSet's current template and the pods' revisions, ask
:func:`~kanri.cache.rollout.decide.decide`, and carry out the one action it names — delete a pod, or a planned
switchover — with an Event each. The state is the ``Updating`` condition (pending pods and what happens now); it is
derived again from the pods every pass, so an operator restarted mid-rollout goes on where the pods are."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kanri import kit
from kanri import runtime as kr
from kanri.cache.agent.resp import Secret
from kanri.cache.api import CacheSpec, FailoverRecord
from kanri.cache.config import SENTINEL_PORT, VALKEY_PORT
from kanri.cache.observe import Assessment
from kanri.cache.rollout.decide import PodState, Replace, RolloutDecision, Settled, Switchover, Wait, decide
from kanri.cache.rollout.sentinels import forget_removed
from kanri.cache.rollout.switchover import Topology, switch_over
from kanri.runtime.kinds import POD, STATEFUL_SET

__all__ = ["CONDITION", "pod_states", "roll", "statefulset_replicas", "update_revision"]

CONDITION = "Updating"
REVISION_LABEL = "controller-revision-hash"
ACT_AGAIN = 1.0
"""Seconds to the next look after an action: the Services follow a new primary, the next pod goes sooner."""


def ordinal(pod: str) -> int:
    return int(pod.rsplit("-", 1)[1])


def statefulset_replicas(spec: CacheSpec, primary: str | None) -> int:
    """The StatefulSet's pod count: ``spec.replicas``, but never fewer than keep the primary's pod (the StatefulSet
    removes the highest ordinals; the primary is switched over first, then its pod may go)."""
    return max(spec.replicas, ordinal(primary) + 1) if primary else spec.replicas


def update_revision(sts: dict[str, Any] | None) -> str | None:
    """The template every pod should run, once the StatefulSet controller has observed the latest spec."""
    if sts is None:
        return None
    status = sts.get("status") or {}
    if status.get("observedGeneration") != sts["metadata"].get("generation"):
        return None
    return status.get("updateRevision")


def pod_states(pods: list[dict[str, Any]]) -> list[PodState]:
    return [
        PodState(
            name=pod["metadata"]["name"],
            ordinal=ordinal(pod["metadata"]["name"]),
            revision=(pod["metadata"].get("labels") or {}).get(REVISION_LABEL),
            terminating=bool(pod["metadata"].get("deletionTimestamp")),
        )
        for pod in pods
    ]


async def roll(ctx: kit.PassContext, spec: CacheSpec, seen: Assessment, password: Secret) -> FailoverRecord | None:
    """One rollout action at most; a planned switchover's record when one happened (the caller records it)."""
    revision = update_revision(ctx.cache.get(STATEFUL_SET, ctx.name, ctx.namespace))
    pods = pod_states(ctx.cache.list(POD, ctx.namespace, ctx.labels.selector(ctx.name)))
    decision = decide(pods, revision, seen, spec.replicas)
    pending = [p.name for p in sorted(pods, key=lambda p: p.ordinal)
               if revision is not None and p.ordinal < spec.replicas and p.revision != revision]  # fmt: skip
    leaving = [p.name for p in pods if p.ordinal >= spec.replicas]
    _stage(ctx, decision, pending, sorted(leaving), spec.storage is not None)
    match decision:
        case Settled() if not leaving:
            await _forget_removed(ctx, spec, password)
        case Replace(pod=pod, reason=reason):
            ctx.requeue(ACT_AGAIN)
            await _replace(ctx, pod, reason)
        case Switchover():
            ctx.requeue(ACT_AGAIN)
            return await _switch(ctx, decision, password, leaving)
    return None


def _stage(ctx: kit.PassContext, decision: RolloutDecision, pending: list[str], leaving: list[str],
           durable: bool) -> None:  # fmt: skip
    if isinstance(decision, Settled) or (not pending and not leaving):
        ctx.ledger.condition(CONDITION, False, "UpToDate", "every pod runs the current template")
        return
    now = {Replace: "ReplacingPod", Switchover: "SwitchingOver", Wait: "Waiting"}[type(decision)]
    parts = [f"pending: {', '.join(pending) or 'none'}"]
    if leaving:
        kept = f" (their volumes are kept: {', '.join(f'data-{pod}' for pod in leaving)})" if durable else ""
        parts.append(f"leaving: {', '.join(leaving)}{kept}")
    reason = getattr(decision, "reason", "")
    ctx.ledger.condition(CONDITION, True, now, f"{reason}; {'; '.join(parts)}")


async def _forget_removed(ctx: kit.PassContext, spec: CacheSpec, password: Secret) -> None:
    """Sentinels that still count removed or replaced pods' Sentinels forget them, one per pass."""
    addresses = kit.pod_addresses(ctx.cache, ctx.labels, ctx.obj)
    if len(addresses) != spec.replicas:
        return
    reset = await forget_removed({pod: f"{ip}:{SENTINEL_PORT}" for pod, ip in addresses.items()}, password, ctx.name)
    if reset is not None:
        why = "counted Sentinels of pods that are gone (a failover needs a majority of all it knows)"
        await ctx.events.normal(ctx.obj, "SentinelReset", f"the Sentinel of {reset} {why}: it relearns its peers")


async def _replace(ctx: kit.PassContext, pod: str, reason: str) -> None:
    found = ctx.cache.get(POD, pod, ctx.namespace)
    if found is None:
        return
    try:
        await ctx.client.delete(POD, pod, ctx.namespace, uid=found["metadata"].get("uid"))
    except kr.ApiError as exc:
        if not (exc.not_found or exc.status == 409):  # gone or replaced since the cache saw it: decide again
            raise
        return
    await ctx.events.normal(ctx.obj, "ReplacingPod", reason)


async def _switch(ctx: kit.PassContext, decision: Switchover, password: Secret, leaving: list[str]
                  ) -> FailoverRecord | None:  # fmt: skip
    addresses = kit.pod_addresses(ctx.cache, ctx.labels, ctx.obj)
    if decision.primary not in addresses or any(pod not in addresses for pod in decision.candidates):
        return None
    await ctx.events.normal(ctx.obj, "SwitchingOver", decision.reason)
    topology = Topology(
        master=ctx.name,
        primary=(decision.primary, f"{addresses[decision.primary]}:{VALKEY_PORT}"),
        candidates={pod: f"{addresses[pod]}:{VALKEY_PORT}" for pod in decision.candidates},
        sentinels=[f"{addresses[pod]}:{SENTINEL_PORT}" for pod in (*decision.candidates, decision.primary)],
        others=[f"{addresses[pod]}:{VALKEY_PORT}" for pod in leaving if pod in addresses and pod != decision.primary],
    )
    outcome = await switch_over(topology, password)
    if outcome.promoted is None:
        await ctx.events.warning(ctx.obj, "SwitchoverFailed", f"{outcome.reason}; trying again at the next look")
        ctx.ledger.condition(CONDITION, True, "SwitchoverFailed", outcome.reason)
        return None
    await ctx.events.normal(ctx.obj, "SwitchedOver", outcome.reason)
    return FailoverRecord(time=datetime.now(UTC), from_pod=decision.primary, to_pod=outcome.promoted,
                          possible_loss_bytes=0, reason=outcome.reason)  # fmt: skip
