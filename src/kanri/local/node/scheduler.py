"""The scheduler: binds every Pod that waits for the default scheduler to the local node, when it fits.

A controller on :mod:`kanri.runtime` keyed by Pod. It is level-triggered: a pod is evaluated again whenever it
changes, the node changes (a label added, a taint removed), a pod on the node changes (resources freed), or one of
the namespace's PersistentVolumeClaims changes (a claim bound). A pod that does not fit stays Pending with
``PodScheduled=False``/``Unschedulable`` and kube-scheduler's message, written through ``pods/status``, plus a
``FailedScheduling`` Event; one that fits is bound with a ``pods/binding`` POST (the API server then sets
``spec.nodeName`` and ``PodScheduled=True``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import structlog

from kanri.local.node import fit
from kanri.local.node.kinds import NODE, PERSISTENT_VOLUME
from kanri.local.node.resources import Resources, add, parse_resources, pod_requests, sum_requests
from kanri.runtime import (
    ApiError,
    Cache,
    Client,
    Controller,
    ControllerOptions,
    EventRecorder,
    Request,
    Result,
    get_condition,
    set_condition,
)
from kanri.runtime.kinds import POD, PVC

Obj = dict[str, Any]
log = structlog.get_logger("kanri.local.scheduler")

DEFAULT_SCHEDULER = "default-scheduler"
_TERMINAL = ("Succeeded", "Failed")
_NODE_MISSING_RETRY = 1.0  # the heartbeat registers the node moments after start


@dataclass(frozen=True)
class _Assumed:
    """A pod we bound whose binding the cache has not shown yet: its requests still count against the node."""

    namespace: str
    name: str
    requests: Resources


class Scheduler:
    """Schedules pods onto ``node_name``; build its controller with :meth:`controller`."""

    def __init__(
        self, cache: Cache, client: Client, node_name: str, *, scheduler_name: str = DEFAULT_SCHEDULER
    ) -> None:
        self._cache = cache
        self._client = client
        self.node_name = node_name
        self.scheduler_name = scheduler_name
        self._events = EventRecorder(client, component="kanri-scheduler")
        # By pod uid. Without it, two pods reconciled back to back could both be given the last free CPU.
        self._assumed: dict[str, _Assumed] = {}

    def controller(self) -> Controller:
        return (
            # Several binds in flight: a 10-pod Deployment no longer waits for each bind and Event in turn.
            Controller("scheduler", self, for_kind=POD, options=ControllerOptions(max_concurrent_reconciles=4))
            .watches(NODE, self._on_node)
            .watches(POD, self._on_pod)
            .watches(PVC, self._on_claim)
        )

    # --- what to look at -------------------------------------------------------------------------------------------

    def _waiting(self, pod: Obj) -> bool:
        """Unbound, ours to schedule, alive."""
        spec, meta = pod.get("spec") or {}, pod["metadata"]
        return (
            not spec.get("nodeName")
            and (spec.get("schedulerName") or DEFAULT_SCHEDULER) == self.scheduler_name
            and not meta.get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") not in _TERMINAL
        )

    def _waiting_requests(self, namespace: str | None = None) -> list[Request]:
        return [
            Request(p["metadata"]["namespace"], p["metadata"]["name"])
            for p in self._cache.list(POD, namespace)
            if self._waiting(p)
        ]

    def _on_node(self, node: Obj) -> list[Request]:
        return self._waiting_requests() if node["metadata"]["name"] == self.node_name else []

    def _on_pod(self, pod: Obj) -> list[Request]:
        # A pod on the node changed (finished, deleted, resized): what was left for the others may have grown.
        return self._waiting_requests() if (pod.get("spec") or {}).get("nodeName") == self.node_name else []

    def _on_claim(self, claim: Obj) -> list[Request]:
        return self._waiting_requests(claim["metadata"]["namespace"])

    # --- the reconcile ---------------------------------------------------------------------------------------------

    async def reconcile(self, request: Request) -> Result | None:
        pod = self._cache.get(POD, request.name, request.namespace)
        if pod is None or not self._waiting(pod):
            return None
        self._forget_settled()
        if pod["metadata"]["uid"] in self._assumed:
            return None  # bound already; the watch has not told the cache yet
        node = self._cache.get(NODE, self.node_name)
        if node is None:
            return Result(requeue_after=_NODE_MISSING_RETRY)
        message = self._why_not(pod, node)
        if message is not None:
            await self._report_unschedulable(pod, message)
            return None
        # Assumed before the bind is sent (no await between the fit check and this line), so reconciles running
        # side by side never hand out the same free CPU twice.
        meta = pod["metadata"]
        self._assumed[meta["uid"]] = _Assumed(meta["namespace"], meta["name"], pod_requests(pod))
        bound = False
        try:
            bound = await self._bind(pod)
        finally:
            if not bound:
                self._assumed.pop(meta["uid"], None)
        return None

    def _why_not(self, pod: Obj, node: Obj) -> str | None:
        """kube-scheduler's message for a pod that cannot go to ``node``, or None when it fits."""
        namespace = pod["metadata"]["namespace"]
        claims = {name: self._cache.get(PVC, name, namespace) for name in fit.claim_names(pod)}
        volumes = {
            str(volume_name): self._cache.get(PERSISTENT_VOLUME, str(volume_name))
            for claim in claims.values()
            if claim is not None and (volume_name := (claim.get("spec") or {}).get("volumeName"))
        }
        pre_filter, volume_reason = fit.check_volumes(pod, claims, volumes, node)
        if pre_filter is not None:
            return fit.unschedulable_message((), pre_filter=pre_filter)
        reasons = [
            reason
            for reason in (
                fit.check_unschedulable(pod, node),
                fit.check_node_selector(pod, node),
                fit.check_taints(pod, node),
                volume_reason,
            )
            if reason is not None
        ]
        on_node = self._pods_on_node()
        used = add(sum_requests(on_node), *(assumed.requests for assumed in self._assumed.values()))
        allocatable = parse_resources((node.get("status") or {}).get("allocatable"))
        reasons += fit.check_resources(pod_requests(pod), allocatable, used, len(on_node) + len(self._assumed))
        return fit.unschedulable_message(reasons) if reasons else None

    def _pods_on_node(self) -> list[Obj]:
        """Pods holding resources on the node: bound to it and not finished (terminating ones still hold them)."""
        return [
            p
            for p in self._cache.list(POD)
            if (p.get("spec") or {}).get("nodeName") == self.node_name
            and (p.get("status") or {}).get("phase") not in _TERMINAL
        ]

    def _forget_settled(self) -> None:
        """Drop assumptions the cache has caught up with: the pod shows as bound, or is gone."""
        for uid, assumed in list(self._assumed.items()):
            pod = self._cache.get(POD, assumed.name, assumed.namespace)
            if pod is None or pod["metadata"]["uid"] != uid or (pod.get("spec") or {}).get("nodeName"):
                del self._assumed[uid]

    async def _bind(self, pod: Obj) -> bool:
        """Bind ``pod`` to the node; False when the API server refused (bound elsewhere, or replaced)."""
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            # The uid makes the API server refuse to bind a different pod that took the same name meanwhile.
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        try:
            await self._client.create_subresource(POD, meta["name"], "binding", binding, meta["namespace"])
        except ApiError as exc:
            if exc.conflict:  # bound by someone else already, or replaced: the next event tells the truth
                log.info("binding refused", pod=f"{meta['namespace']}/{meta['name']}", error=exc.message)
                return False
            raise
        log.info("pod bound", pod=f"{meta['namespace']}/{meta['name']}", node=self.node_name)
        await self._events.normal(
            pod, "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} to {self.node_name}"
        )
        return True

    async def _report_unschedulable(self, pod: Obj, message: str) -> None:
        """``PodScheduled=False``/``Unschedulable`` with ``message`` and a Warning Event, only when that changed."""
        conditions = copy.deepcopy((pod.get("status") or {}).get("conditions") or [])
        current = get_condition(conditions, "PodScheduled")
        if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
            "False",
            "Unschedulable",
            message,
        ):
            return  # already says so: no write (and no Event) for a pod we looked at again
        set_condition(conditions, type="PodScheduled", status="False", reason="Unschedulable", message=message,
                      observed_generation=None)  # fmt: skip
        condition = get_condition(conditions, "PodScheduled")
        assert condition is not None
        fields = ("type", "status", "reason", "message", "lastTransitionTime")
        # A strategic merge keyed by condition type touches only PodScheduled, whoever else writes conditions.
        patch = {"status": {"conditions": [{k: condition[k] for k in fields}]}}
        meta = pod["metadata"]
        await self._client.patch(
            POD, meta["name"], patch, meta["namespace"], patch_type="strategic", subresource="status"
        )
        log.info("pod unschedulable", pod=f"{meta['namespace']}/{meta['name']}", reason=message)
        await self._events.warning(pod, "FailedScheduling", message)
