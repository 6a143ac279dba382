"""The PostgresCluster reconciler: the seed's six steps, one guarded step per concern.

``reconcile`` loads the cluster from the cache and handles deletion (steps 1-2); :class:`ClusterPass` runs the rest
for one pass over one cluster: validate (3), build the children with deterministic names and compare them with the
cache (4), write only what differs and observe the instances (5), then write status and Events and ask to look again
in ``refresh`` seconds, since the instances' state is not something Kubernetes can watch (6).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from kanri.postgres import names
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.children.config import config_map
from kanri.postgres.children.pdb import disruption_budgets, wants_budgets
from kanri.postgres.children.pvc import claim
from kanri.postgres.children.rbac import rbac
from kanri.postgres.children.services import services
from kanri.postgres.children.statefulset import bootstrap_role, image_major, statefulset
from kanri.postgres.deletion import FINALIZER, cleanup
from kanri.postgres.diff import is_subset
from kanri.postgres.instances import InstanceClient, InstanceReport, gather_reports
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import CLUSTER, PRIMARY, REPLICA, ROLE
from kanri.postgres.metrics import PostgresMetrics
from kanri.postgres.restarts import next_restart
from kanri.postgres.secrets import desired_secrets, secret_value
from kanri.postgres.status import Observation, compute_status, condition_flipped, status_patch
from kanri.postgres.storage import StoragePlan, plan_storage
from kanri.postgres.sync import ensure
from kanri.postgres.topology import InstancePlan, plan_instances
from kanri.runtime import (
    ApiError,
    Cache,
    Client,
    EventRecorder,
    Kind,
    PermanentError,
    Request,
    Result,
    add_finalizer,
    finalizer_step,
    get_condition,
    is_controlled_by,
    remove_finalizer,
)
from kanri.runtime.kinds import (
    CONFIG_MAP,
    POD,
    POD_DISRUPTION_BUDGET,
    PVC,
    ROLE_BINDING,
    SECRET,
    SERVICE,
    SERVICE_ACCOUNT,
    STATEFUL_SET,
    STORAGE_CLASS,
)
from kanri.runtime.kinds import ROLE as RBAC_ROLE

__all__ = ["ClusterPass", "PostgresClusterReconciler", "validated_spec"]

Obj = dict[str, Any]
log = structlog.get_logger("kanri.postgres")

_RETRY_BLOCKED = 2.0  # a child of ours still held by a deleted owner: the garbage collector is quick
_RESTART_COOLDOWN = 60.0  # do not ask the same instance to restart again before it had time to report


def validated_spec(cluster: Obj) -> PostgresClusterSpec:
    """Step 3: the typed spec, or a PermanentError naming what the operator cannot do with it."""
    try:
        spec = PostgresClusterSpec.model_validate(cluster.get("spec") or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise PermanentError("InvalidSpec", f"spec.{where}: {first['msg']}") from exc
    if spec.bootstrap.recovery is not None:
        raise PermanentError("RecoveryNotSupported", "bootstrap.recovery is not implemented by this operator version")
    return spec


class PostgresClusterReconciler:
    """Keeps every PostgresCluster's children, instances and status in line with its spec.

    ``instances`` is how the operator reaches the instance managers (injectable: tests answer at the HTTP boundary);
    ``refresh`` is how often a cluster is looked at again to read its instances' state.
    """

    def __init__(
        self,
        cache: Cache,
        client: Client,
        *,
        instances: InstanceClient,
        events: EventRecorder | None = None,
        refresh: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        metrics: PostgresMetrics | None = None,
    ) -> None:
        self.metrics = metrics
        self.cache = cache
        self.client = client
        self.instances = instances
        self.events = events or EventRecorder(client, component="kanri-postgres")
        self.refresh = refresh
        self.clock = clock
        self.restart_requests: dict[tuple[str, str], float] = {}
        """(namespace, instance) -> when a restart was last requested (kept in memory: losing it costs one more
        request after an operator restart, which the instance answers harmlessly)."""

    async def reconcile(self, request: Request) -> Result | None:
        cluster = self.cache.get(POSTGRES_CLUSTER, request.name, request.namespace)
        if cluster is None:
            if self.metrics is not None:
                self.metrics.forget(request.namespace, request.name)
            return None  # gone: owned children follow through garbage collection, the data stayed or went already
        # Steps 1-2: a cluster being deleted gets its deletionPolicy carried out, then is let go.
        match finalizer_step(cluster, FINALIZER):
            case "done":
                return None
            case "cleanup":
                if self.metrics is not None:
                    deleted = datetime.fromisoformat(cluster["metadata"]["deletionTimestamp"].replace("Z", "+00:00"))
                    self.metrics.deleting(cluster, deleted.timestamp())
                await cleanup(self.client, self.cache, self.events, cluster)
                try:
                    await remove_finalizer(self.client, POSTGRES_CLUSTER, cluster, FINALIZER)
                except ApiError as exc:
                    if not exc.not_found:  # gone already: an earlier pass removed the finalizer
                        raise
                return None
            case "add":
                # Before the first write, so whatever is created later is cleaned up per deletionPolicy.
                cluster = await add_finalizer(self.client, POSTGRES_CLUSTER, cluster, FINALIZER)
            case "apply":
                pass
        return await ClusterPass(self, cluster, validated_spec(cluster)).run()


class ClusterPass:
    """One reconcile of one cluster (steps 4-6). Each step returns nothing and records what the status needs."""

    def __init__(self, reconciler: PostgresClusterReconciler, cluster: Obj, spec: PostgresClusterSpec) -> None:
        self.r = reconciler
        self.cluster = cluster
        self.spec = spec
        meta = cluster["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.uid: str = meta["uid"]
        self.running = spec.replicas > 0
        self.blocked: list[str] = []
        self.rolling: str | None = None
        self.waiting_to_roll: list[str] = []
        """Children another (deleted) owner still controls; looked at again shortly."""

    @property
    def cache(self) -> Cache:
        return self.r.cache

    @property
    def client(self) -> Client:
        return self.r.client

    async def run(self) -> Result:
        await self.credentials()  # before any pod that mounts them
        plan = self.plan()
        await self.shared_children(plan)
        scaled = await self.scale(plan)
        await self.instances(plan)
        await self.budgets(plan)
        storage = await self.storage(plan)
        reports, pods = await self.observe(plan)
        await self.label_pods(plan, reports, pods)
        restarting = await self.restart(plan, reports)
        observation = Observation(plan=plan, hibernated=not self.running, reports=reports, pods=pods,
                                  generation=int(self.cluster["metadata"].get("generation", 0)), storage=storage,
                                  scaled=scaled, restarting=restarting, rolling=self.rolling,
                                  waiting_to_roll=tuple(self.waiting_to_roll))  # fmt: skip
        await self.report(observation)
        return Result(requeue_after=_RETRY_BLOCKED if self.blocked else self.r.refresh)

    # --- step 4/5: children ----------------------------------------------------------------------------------------

    async def credentials(self) -> None:
        """Generate each missing credential Secret once; an existing one is adopted as it is."""
        owner = self.spec.bootstrap.initdb.owner if self.spec.bootstrap.initdb else "app"
        for wanted in desired_secrets(self.name, owner):
            if self.cache.get(SECRET, wanted.name, self.namespace) is not None:
                continue
            try:
                await self.client.create(SECRET, wanted.build(self.name, self.namespace))
            except ApiError as exc:
                if exc.status != 409:
                    raise
                continue  # exists, the cache had not seen it yet: adopted, never overwritten
            await self.r.events.normal(self.cluster, "CreatedSecret", f"generated Secret {wanted.name}")

    def existing_instances(self) -> list[str]:
        """Instances with a volume or a StatefulSet (not being deleted): they hold data or run."""
        claims = self.cache.list(PVC, self.namespace, {CLUSTER: self.name})
        sets = self.cache.owned_by(STATEFUL_SET, self.uid)
        return [o["metadata"]["name"] for o in [*claims, *sets] if not o["metadata"].get("deletionTimestamp")]

    def plan(self) -> InstancePlan:
        current = (self.cluster.get("status") or {}).get("currentPrimary") or self.bootstrapping_primary()
        return plan_instances(self.name, self.spec.replicas, self.existing_instances(), current)

    def bootstrapping_primary(self) -> str | None:
        """Before any instance has reported (status names no primary): the instance already told to bootstrap as
        primary, if an earlier pass — perhaps of an operator killed midway — created one. Choosing another would
        leave every instance waiting to clone from a primary that never initialises."""
        for sts in self.cache.owned_by(STATEFUL_SET, self.uid):
            if bootstrap_role(sts) == PRIMARY and not sts["metadata"].get("deletionTimestamp"):
                return str(sts["metadata"]["name"])
        return None

    async def apply(self, kind: Kind, desired: Obj) -> str:
        outcome = await ensure(self.client, self.cache, kind, desired, self.uid)
        if outcome == "blocked":
            self.blocked.append(f"{kind.kind} {desired['metadata']['name']}")
            log.info("child still controlled by a deleted owner; waiting", kind=kind.kind,
                     child=desired["metadata"]["name"])  # fmt: skip
        return outcome

    async def shared_children(self, plan: InstancePlan) -> None:
        """The ConfigMap (parameters and instance list), the instances' RBAC, and the three Services."""
        await self.apply(CONFIG_MAP, config_map(self.cluster, self.spec, plan.instances))
        for kind, obj in zip((SERVICE_ACCOUNT, RBAC_ROLE, ROLE_BINDING), rbac(self.cluster), strict=True):
            await self.apply(kind, obj)
        for service in services(self.cluster):
            await self.apply(SERVICE, service)

    async def scale(self, plan: InstancePlan) -> bool:
        """Remove the replicas the plan drops (StatefulSet, then volume: a replica's data is on the primary)."""
        before = len(plan.instances) - len(plan.added) + len(plan.removed)
        scaling = before > 0 and bool(plan.added or plan.removed)  # not the cluster's creation
        if scaling:
            change = [f"adding {', '.join(plan.added)}" if plan.added else "",
                      f"removing {', '.join(plan.removed)}" if plan.removed else ""]  # fmt: skip
            await self.r.events.normal(self.cluster, "Scaling", f"instances {before} -> {len(plan.instances)}: "
                                       + "; ".join(c for c in change if c))  # fmt: skip
        for instance in plan.removed:
            sts = self.cache.get(STATEFUL_SET, instance, self.namespace)
            if sts is not None and is_controlled_by(sts, self.cluster):
                await self.client.delete(STATEFUL_SET, instance, self.namespace, propagation_policy="Background")
            if self.cache.get(PVC, instance, self.namespace) is not None:
                await self.client.delete(PVC, instance, self.namespace)
            await self.r.events.normal(self.cluster, "RemovedInstance", f"removed replica {instance} and its volume")
        return scaling

    def running_major(self) -> int:
        """The major the instances run: an existing StatefulSet's, else ``spec.version``. A raised ``version`` is a
        major upgrade, which only the upgrade procedure may carry out — never a plain image change."""
        majors = [m for s in self.cache.owned_by(STATEFUL_SET, self.uid) if (m := image_major(s)) is not None]
        return min(majors, default=self.spec.version)

    def settled(self, plan: InstancePlan) -> bool:
        """Every instance's StatefulSet has rolled out its current template and its pod is Ready."""
        for instance in plan.instances:
            sts = self.cache.get(STATEFUL_SET, instance, self.namespace)
            pod = self.cache.get(POD, names.pod_name(instance), self.namespace)
            if sts is None or pod is None:
                return False
            status = sts.get("status") or {}
            if status.get("observedGeneration") != sts["metadata"].get("generation"):
                return False
            if status.get("updateRevision") != status.get("currentRevision") or not status.get("readyReplicas"):
                return False
            ready = get_condition((pod.get("status") or {}).get("conditions"), "Ready")
            if ready is None or ready["status"] != "True":
                return False
        return True

    def rollout_order(self, plan: InstancePlan) -> list[str]:
        """Replicas first and the primary last once it exists (a template change restarts the primary once, after
        its replicas); a primary yet to be created comes first — replicas clone from it."""
        primary = (self.cluster.get("status") or {}).get("currentPrimary") or plan.primary
        if primary is None or self.cache.get(STATEFUL_SET, primary, self.namespace) is None:
            return [i for i in plan.instances if i == primary] + [i for i in plan.instances if i != primary]
        return [i for i in plan.instances if i != primary] + [i for i in plan.instances if i == primary]

    async def instances(self, plan: InstancePlan) -> None:
        """Each instance's claim (created once, never owned) and StatefulSet (1 replica, 0 while hibernated).

        A changed pod template (resources, placement, image settings) restarts the pod, so it is rolled out one
        instance at a time, replicas first and the primary last, each only once every instance is Ready again."""
        major = self.running_major()
        settled: bool | None = None
        for instance in self.rollout_order(plan):
            if self.cache.get(PVC, instance, self.namespace) is None:
                storage_class = self.spec.storage.storage_class_name
                try:
                    await self.client.create(PVC, claim(self.cluster, instance, self.spec.storage.size, storage_class))
                except ApiError as exc:
                    if exc.status != 409:
                        raise
            current = self.cache.get(STATEFUL_SET, instance, self.namespace)
            kept = bootstrap_role(current) if current is not None and is_controlled_by(current, self.cluster) else None
            role = kept or (PRIMARY if instance == plan.primary else REPLICA)
            desired = statefulset(self.cluster, self.spec, instance, role=role, major=major, running=self.running)
            if self.restarts_pod(current, desired):
                settled = self.settled(plan) if settled is None else settled
                if self.rolling is not None or not settled:
                    self.waiting_to_roll.append(instance)
                    continue
                self.rolling = instance
            outcome = await self.apply(STATEFUL_SET, desired)
            if outcome == "created":
                await self.r.events.normal(self.cluster, "CreatedInstance",
                                           f"created instance {instance} (bootstraps as {role})")  # fmt: skip
            elif outcome == "updated" and current is not None:
                was = int((current.get("spec") or {}).get("replicas", 1))
                if was != (1 if self.running else 0):
                    reason, verb = ("Waking", "starting") if self.running else ("Hibernating", "stopping")
                    await self.r.events.normal(self.cluster, reason, f"{verb} instance {instance}")
                else:
                    await self.r.events.normal(self.cluster, "UpdatedInstance", f"updated instance {instance}")

    def restarts_pod(self, current: Obj | None, desired: Obj) -> bool:
        """Whether applying ``desired`` would replace a running pod (its template changes while it runs)."""
        if current is None or not self.running or int((current.get("spec") or {}).get("replicas", 0)) == 0:
            return False
        return not is_subset(desired["spec"]["template"], (current.get("spec") or {}).get("template"))

    async def budgets(self, plan: InstancePlan) -> None:
        """Disruption budgets while a primary and replicas run; none otherwise."""
        if wants_budgets(len(plan.instances), not self.running):
            for budget in disruption_budgets(self.cluster):
                await self.apply(POD_DISRUPTION_BUDGET, budget)
            return
        for name in (names.primary_pdb(self.name), names.replica_pdb(self.name)):
            existing = self.cache.get(POD_DISRUPTION_BUDGET, name, self.namespace)
            if existing is not None and is_controlled_by(existing, self.cluster):
                await self.client.delete(POD_DISRUPTION_BUDGET, name, self.namespace)

    async def storage(self, plan: InstancePlan) -> StoragePlan:
        """Grow every claim to ``spec.storage.size`` when its class allows it; report it when it does not."""
        claims = [c for i in plan.instances if (c := self.cache.get(PVC, i, self.namespace)) is not None]
        classes = {c["metadata"]["name"]: c for c in self.cache.list(STORAGE_CLASS)}
        result = plan_storage(claims, self.spec.storage.size, classes)
        for name, patch in result.grow.items():
            await self.client.patch(PVC, name, patch, self.namespace)
        if result.grow:
            await self.r.events.normal(self.cluster, "ResizingStorage", f"growing volumes "
                                       f"{', '.join(sorted(result.grow))} to {self.spec.storage.size}")  # fmt: skip
        return result

    # --- step 5: instances -----------------------------------------------------------------------------------------

    async def observe(self, plan: InstancePlan) -> tuple[dict[str, InstanceReport], dict[str, Obj]]:
        """Each instance's pod (from the cache) and its instance manager's report (over HTTP)."""
        pods: dict[str, Obj] = {}
        for instance in plan.instances:
            pod = self.cache.get(POD, names.pod_name(instance), self.namespace)
            if pod is not None and (pod["metadata"].get("labels") or {}).get(CLUSTER) == self.name:
                pods[instance] = pod
        if not self.running:
            return {}, pods
        addresses = {
            instance: ip
            for instance, pod in pods.items()
            if (ip := (pod.get("status") or {}).get("podIP")) and not pod["metadata"].get("deletionTimestamp")
        }
        reports = await gather_reports(self.r.instances, addresses)
        # An address can be reused by another pod: trust a report only from the instance it names.
        return {name: report for name, report in reports.items() if report.name == name}, pods

    async def label_pods(self, plan: InstancePlan, reports: dict[str, InstanceReport], pods: dict[str, Obj]) -> None:
        """``kanri.dev/role`` on each pod, from the role its instance reports, so the Services route right.

        Before an instance reports, a pod without the label gets its expected role (the primary the plan chose,
        replicas otherwise): replicas clone from ``-rw``, so the bootstrap primary must be behind it first. A label
        is never flipped without a report saying so.
        """
        for instance, pod in pods.items():
            labels = pod["metadata"].get("labels") or {}
            report = reports.get(instance)
            if report is not None:
                wanted = report.role
            elif ROLE in labels:
                continue
            else:
                wanted = PRIMARY if instance == plan.primary else REPLICA
            if labels.get(ROLE) == wanted:
                continue
            try:
                await self.client.patch(POD, pod["metadata"]["name"], {"metadata": {"labels": {ROLE: wanted}}},
                                        self.namespace)  # fmt: skip
            except ApiError as exc:
                if not exc.not_found:
                    raise

    async def restart(self, plan: InstancePlan, reports: dict[str, InstanceReport]) -> str | None:
        """Restart one instance whose parameters need it (replicas first, the primary last)."""
        primary = next((n for n, r in reports.items() if r.role == "primary"), plan.primary)
        target = next_restart(plan.instances, primary, reports)
        if target is None:
            return None
        key = (self.namespace, target)
        asked = self.r.restart_requests.get(key)
        if asked is not None and self.r.clock() - asked < _RESTART_COOLDOWN:
            return target
        token = secret_value(self.cache.get(SECRET, names.api_secret(self.name), self.namespace), "token")
        pod = self.cache.get(POD, names.pod_name(target), self.namespace)
        address = ((pod or {}).get("status") or {}).get("podIP")
        if token is None or not address:
            return None
        if await self.r.instances.restart(address, token):
            self.r.restart_requests[key] = self.r.clock()
            await self.r.events.normal(self.cluster, "RestartingInstance",
                                       f"restarting {target} to apply parameters that need a restart")  # fmt: skip
        return target

    # --- step 6: status and events ---------------------------------------------------------------------------------

    async def report(self, observation: Observation) -> None:
        old = self.cluster.get("status") or {}
        new = compute_status(old, observation, datetime.now(UTC))
        if self.r.metrics is not None:
            self.r.metrics.observe({**self.cluster, "status": new}, observation.reports)
        patch = status_patch(old, new)
        if patch is None:
            return  # converged: not even a status write
        await self.client.patch_status(POSTGRES_CLUSTER, self.name, {"status": patch}, self.namespace)
        ready = condition_flipped(old, new, "Ready")
        if ready is not None and ready["status"] == "True":
            await self.r.events.normal(self.cluster, "ClusterReady", ready["message"])
        elif ready is not None and ready["reason"] != "Hibernated" and old.get("phase") == "Ready":
            await self.r.events.warning(self.cluster, "ClusterNotReady", ready["message"])
        storage = condition_flipped(old, new, "StorageResizing")
        if storage is not None and storage["reason"] == "ExpansionNotSupported":
            await self.r.events.warning(self.cluster, "StorageExpansionNotSupported", storage["message"])
