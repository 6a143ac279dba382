"""The PostgresCluster reconciler: the seed's six steps, one guarded step per concern.

``reconcile`` loads the cluster from the cache and handles deletion (steps 1-2); :class:`ClusterPass` runs the rest
for one pass over one cluster: validate (3), build the children with deterministic names and compare them with the
cache (4), write only what differs and observe the instances (5), then write status and Events and ask to look again
in ``refresh`` seconds, since the instances' state is not something Kubernetes can watch (6).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from kanri.kit import ObjectMemory
from kanri.postgres import names
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.backup import archiving as backup
from kanri.postgres.backup import schedule as backup_schedule
from kanri.postgres.backup.archiving import BackupSettings
from kanri.postgres.backup.cleanup import BackupCleanup
from kanri.postgres.children.config import config_map
from kanri.postgres.children.images import DEFAULT_IMAGES, PostgresImages
from kanri.postgres.children.networkpolicy import OPERATOR_NAMESPACE, network_policy
from kanri.postgres.children.pvc import claim
from kanri.postgres.children.rbac import service_account
from kanri.postgres.children.services import services
from kanri.postgres.children.statefulset import bootstrap_role, image_major, postgres_image, statefulset
from kanri.postgres.cluster.answers import AnswerMemory, with_grace
from kanri.postgres.cluster.deletion import FINALIZER, cleanup
from kanri.postgres.cluster.instances import InstanceClient, InstanceReport, instance_endpoint
from kanri.postgres.cluster.observe import bootstrapping_primary, existing_instances, observe
from kanri.postgres.cluster.observe import claims as claims_of
from kanri.postgres.cluster.pod_problems import pod_problems
from kanri.postgres.cluster.problems import (
    Problem,
    child_conflict,
    child_rejected,
    report_problems,
    volume_lost,
)
from kanri.postgres.cluster.recorded import (
    annotation_patches,
    recorded_major,
    recorded_primary,
    recorded_system_identifier,
)
from kanri.postgres.cluster.report import report
from kanri.postgres.cluster.routed import unrouted
from kanri.postgres.cluster.status import SWITCHOVER_SETTLE, Observation
from kanri.postgres.cluster.sync import ensure
from kanri.postgres.credentials import step as credentials_step
from kanri.postgres.ha import durability as sync_durability
from kanri.postgres.ha import primary_update
from kanri.postgres.ha.failover import SUSPECT_INTERVAL
from kanri.postgres.ha.failover_step import FailoverStep, StepResult
from kanri.postgres.ha.maintenance import maintenance_target
from kanri.postgres.ha.memory import FailoverMemory
from kanri.postgres.ha.position import NODE_GRACE
from kanri.postgres.ha.primary import choose_primary, gate_removals
from kanri.postgres.ha.reads import ReadLag, read_lag, withheld_problem
from kanri.postgres.ha.rejoin import rejoining, withhold_rejoining
from kanri.postgres.ha.routing import fence_rogues, held_by_failover, label_pods
from kanri.postgres.ha.splitbrain import Verdict, decide, fenced_names, next_record, routed, split_brain_problem
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import (
    PRIMARY,
    REPLICA,
    cluster_routes_by_app,
    cluster_routes_by_reads,
    isolates_by_app,
    missing_labels,
    statefulset_by_app,
)
from kanri.postgres.metrics import PostgresMetrics
from kanri.postgres.pods import metadata as pod_metadata
from kanri.postgres.pods import oneshot
from kanri.postgres.pods import policy as pod_policy
from kanri.postgres.recovery import bootstrap as recovery
from kanri.postgres.recovery import rehearsal as restore_test
from kanri.postgres.recovery.bootstrap import Restore
from kanri.postgres.tls.rotation import TlsSettings
from kanri.postgres.tls.step import ensure_tls
from kanri.postgres.topology import rollout
from kanri.postgres.topology import step as topology_step
from kanri.postgres.topology.plan import InstancePlan, plan_instances
from kanri.postgres.topology.restarts import RestartMemory, next_restart
from kanri.postgres.topology.storage import StoragePlan
from kanri.postgres.upgrade import step as upgrade_step
from kanri.postgres.upgrade.versions import running_major, upgrade_verdict
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
    controller_of,
    deletion_time,
    finalizer_step,
    get_condition,
    is_controlled_by,
    parse_optional_time,
    remove_finalizer,
)
from kanri.runtime.kinds import (
    CONFIG_MAP,
    NETWORK_POLICY,
    PVC,
    SERVICE,
    SERVICE_ACCOUNT,
    STATEFUL_SET,
    STORAGE_CLASS,
)

__all__ = ["ClusterPass", "PostgresClusterReconciler", "validated_spec"]

Obj = dict[str, Any]
log = structlog.get_logger("kanri.postgres")

_RETRY_BLOCKED = 2.0  # a child of ours still held by a deleted owner: the garbage collector is quick
_UPGRADE_POLL = 2.0  # a major upgrade under way: its pods and its downtime are watched closely
_ROUTE_POLL = 1.0  # every instance is ready but -rw does not route to the primary yet: Ready follows within a second
_RETRIED_STATUSES = frozenset({429, 503, 504})  # throttled or unavailable: retried with backoff, not a refusal
_RESTART_COOLDOWN = 60.0  # do not ask the same instance to restart again before it had time to report
# A changed ConfigMap reaches the instance managers a few config intervals (2 s) apart: restart only once the set of
# instances reporting a pending restart has held that long, or a replica that saw a lowered max_connections first is
# restarted before its primary reports it (CI caught the replica crash-looping on "insufficient parameter settings").
_RESTART_SETTLE = 8.0


@dataclass
class Seen:
    """What a pass read before it changed anything."""

    raw: dict[str, InstanceReport]
    """The instances' reports as they answered."""
    reports: dict[str, InstanceReport]
    """As routed: a fenced or rejoining instance never reads as a primary."""
    pods: dict[str, Obj]
    claims: dict[str, Obj]
    existing: list[str]
    marked: dict[str, int]
    """Former primaries that must rejoin (instance -> the timeline to follow)."""
    recorded: str | None
    """The primary recorded on the claims."""
    verdict: Verdict
    split_brain: Obj | None
    """``status.splitBrain`` after this pass."""


@dataclass
class Data:
    """The instances the cluster should have, and what its data is."""

    plan: InstancePlan
    major: int
    system_identifier: str | None
    removal_waiting: dict[str, str]


@dataclass
class Changes:
    """What the converging steps did that the status reports."""

    scaled: bool = False
    storage: StoragePlan = field(default_factory=StoragePlan)
    restarting: str | None = None


def validated_spec(cluster: Obj) -> PostgresClusterSpec:
    """Step 3: the typed spec, or a PermanentError naming what the operator cannot do with it."""
    try:
        spec = PostgresClusterSpec.model_validate(cluster.get("spec") or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise PermanentError("InvalidSpec", f"spec.{where}: {first['msg']}") from exc
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
        operator_namespace: str = OPERATOR_NAMESPACE,
    ) -> None:
        self.metrics = metrics
        self.operator_namespace = operator_namespace
        """Where the operator's own pods run: the NetworkPolicy admits them, and only them, to the instance API."""
        self.backup = BackupSettings()
        """The platform's default backup repository and the backup metrics (set by build_manager)."""
        self.backup_cleanup = BackupCleanup(lambda: self.backup)
        self.allowed_priority_classes: tuple[str, ...] = ()
        """The priority classes a pod template may name (``kanri run --allowed-priority-class``; empty: any)."""
        self.node_monitor_grace = NODE_GRACE
        """The node lifecycle controller's grace before it marks a silent node (``kanri run --node-monitor-grace``)."""
        self.tls = TlsSettings()
        """The CA's lifetime and the pace of its rotation (:mod:`kanri.postgres.tls.rotation`)."""
        self.images = DEFAULT_IMAGES
        """The PostgreSQL images per major (the platform's configuration, :mod:`kanri.postgres.children.images`)."""
        self.cache = cache
        self.client = client
        self.instances = instances
        self.events = events or EventRecorder(client, component="kanri-postgres")
        self.refresh = refresh
        self.clock = clock
        self.ha = ObjectMemory(FailoverMemory)
        """Failover memory, per cluster uid (losing it only delays a failover, never hastens one)."""
        self.restarts = ObjectMemory(RestartMemory)
        """Restart memory, per cluster uid (see ``_RESTART_SETTLE`` and ``_RESTART_COOLDOWN``)."""
        self.answers = ObjectMemory(AnswerMemory)
        """The instances' last answers, per cluster uid (a grace of one missed answer; :mod:`.answers`)."""
        self.background: set[asyncio.Task[None]] = set()
        """Requests that must not hold a pass up (fencing a primary that does not answer)."""

    async def own_background(self) -> None:
        """The manager's leader-only runnable for what passes started and did not wait for (fencing requests, late
        probes, the deletion of a deleted cluster's backups): waits, and at shutdown cancels them all."""
        try:
            await asyncio.Event().wait()
        finally:
            for task in list(self.background):
                task.cancel()
            await self.backup_cleanup.work.aclose()

    async def reconcile(self, request: Request) -> Result | None:
        cluster = self.cache.get(POSTGRES_CLUSTER, request.name, request.namespace)
        if cluster is None:
            if self.metrics is not None:
                self.metrics.forget(request.namespace, request.name)
            self.ha.drop(request.namespace, request.name)
            self.restarts.drop(request.namespace, request.name)
            self.answers.drop(request.namespace, request.name)
            return None  # gone: owned children follow through garbage collection, the data stayed or went already
        # Steps 1-2: a cluster being deleted gets its deletionPolicy carried out, then is let go.
        match finalizer_step(cluster, FINALIZER):
            case "done":
                await self.mark_deleting(cluster)  # another finalizer still holds it
                return None
            case "cleanup":
                if self.metrics is not None:
                    deleted = deletion_time(cluster)
                    self.metrics.deleting(cluster, deleted.timestamp() if deleted else time.time())
                cluster = await self.mark_deleting(cluster)
                await cleanup(self.client, self.cache, self.events, cluster)
                # then the backups (deletionPolicy Delete waits for the pods: a stopping primary still archives)
                if (later := await self.backup_cleanup.run(self.client, self.cache, self.events, cluster)) is not None:
                    return later
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

    async def mark_deleting(self, cluster: Obj) -> Obj:
        """``phase: Deleting`` once deletion was asked (the cluster may wait on finalizers for a while); returns the
        cluster as written, so a guarded finalizer patch after it carries the new resourceVersion."""
        if (cluster.get("status") or {}).get("phase") == "Deleting":
            return cluster
        meta = cluster["metadata"]
        try:
            return await self.client.patch_status(POSTGRES_CLUSTER, meta["name"], {"status": {"phase": "Deleting"}},
                                                  meta["namespace"])  # fmt: skip
        except ApiError as exc:
            if not exc.not_found:
                raise
            return cluster


class ClusterPass:
    """One reconcile of one cluster (steps 4-6). Each step records what the status needs; a child write the API
    server refuses is recorded as a problem (condition and Event) and the rest of the pass goes on."""

    def __init__(self, reconciler: PostgresClusterReconciler, cluster: Obj, spec: PostgresClusterSpec) -> None:
        self.r = reconciler
        self.cluster = cluster
        self.spec = spec
        meta = cluster["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.uid: str = meta["uid"]
        self.status: Obj = cluster.get("status") or {}
        # a major upgrade stops every instance while pg_upgrade runs on the primary's volume (upgrade_step.py)
        self.upgrading = upgrade_step.stops_instances(self.status)
        self.running = spec.replicas > 0 and not self.upgrading
        self.upgrade_busy = False
        self.blocked: list[str] = []
        """Children a deleted owner still controls (the garbage collector is about to remove them)."""
        self.problems: list[Problem] = []
        # the platform's pod policy: a priority class it does not hand out is left out of the pods, and said
        self.spec, refused = pod_policy.allowed_spec(spec, reconciler.allowed_priority_classes)
        if refused is not None:
            self.problems.append(refused)
        self.rolling: str | None = None
        self.waiting_to_roll: list[str] = []
        self.failover: FailoverStep | None = None
        self.switching: StepResult | None = None
        """A switchover this pass began to update the primary (``primary_update.py``)."""
        self.primary_waiting: str | None = None
        """Why the primary's update waits (a planned switchover for this spec failed)."""
        self.primary_behind = False
        """The primary still lacks the pod template or the parameters its replicas have."""
        self.unrouted: str | None = None
        """Why ``-rw`` does not route to the primary yet (:mod:`kanri.postgres.cluster.routed`)."""
        self.reads = ReadLag(lag={}, withheld={})
        """The replicas' lag as the primary sees it, and those withheld from reads (:mod:`kanri.postgres.ha.reads`)."""
        self.durability: sync_durability.Durability | None = None
        """How many synchronous standbys commits wait for now (:mod:`kanri.postgres.ha.durability`)."""

    @property
    def cache(self) -> Cache:
        return self.r.cache

    @property
    def images(self) -> PostgresImages:
        return self.r.images

    @property
    def client(self) -> Client:
        return self.r.client

    @property
    def instance_client(self) -> InstanceClient:
        return self.r.instances

    @property
    def events(self) -> EventRecorder:
        return self.r.events

    @property
    def metrics(self) -> PostgresMetrics | None:
        return self.r.metrics

    @property
    def backup_settings(self) -> BackupSettings:
        return self.r.backup

    async def announce(self, reason: str, message: str) -> None:
        """A Normal Event on the cluster (the TLS step's CA rotation)."""
        await self.events.normal(self.cluster, reason, message)

    def adopt_status(self, updated: Obj) -> None:
        """A concern's step wrote status: later steps of this pass read what it returned, not the cache's copy."""
        self.status = updated.get("status") or {}
        self.cluster = {**self.cluster, "status": self.status}

    async def run(self) -> Result:
        await credentials_step.ensure(self)  # before any pod that mounts them
        # CA, server certificate; a TLS Secret that is wrong is named (InvalidServerSecret), never trusted
        self.problems.extend(await ensure_tls(self, self.spec.replicas, self.r.instances, self.r.metrics,
                                              settings=self.r.tls, announce=self.announce))  # fmt: skip
        # Where WAL goes (the cluster's repository or the platform's), its key pair copied before pods mount it.
        repository = backup.resolve(self.spec, self.namespace, self.r.backup)
        credentials_problem = await backup.ensure_credentials(self, repository)
        # Observe first: which instance is primary, and what the data is, come from the instances themselves; a
        # second primary is fenced before anything else this pass (routing first, then its PostgreSQL stopped).
        seen = await self.look()
        # The primary failed (or a switchover was asked): fence, elect, promote — before anything else changes.
        step = await self.fail_over(seen)
        if step.promoted:
            return Result(requeue_after=SUSPECT_INTERVAL)  # the next pass sees the new primary's claim and report
        data = await self.the_data(seen)
        archive = backup.archive_target(repository, backup.server_name(self.cluster))
        # bootstrap.recovery: where the source's backups are; no instance before that is known (it would initdb)
        restore = await recovery.prepare(self, self.r.backup, archive, initialised=data.system_identifier is not None)
        # dataDurability preferred: as many synchronous standbys as replicas stream now (never more than asked)
        self.durability = self.synchronous_standbys(seen, data.plan)
        await self.shared_children(data.plan, data.system_identifier, archive, restore.entry)
        # A failover in progress changes nothing else: no rollout, scale-down or restart.
        # ...and the instances it is handing the primary role between are routed by it alone (reports read before)
        held = held_by_failover(step.active, step.progress)
        changes = await self.converge(seen, data, restore, failing_over=step.active, held=held)
        if self.switching is not None:  # the primary's update began a switchover: report it as one
            step = self.switching
            self.cluster, self.status = step.cluster, step.cluster.get("status") or {}
        self.find_problems(seen)
        self.unrouted = await self.routing_to_primary(seen, data.plan)  # Ready waits for -rw to route to it
        await report(self, self.observation(seen, data, changes, step))
        # status.upgrade: approval, gates, check, pg_upgrade
        self.upgrade_busy = await upgrade_step.run(self, data.major, data.plan, seen.reports)
        primary_report = seen.reports.get(data.plan.primary) if data.plan.primary else None
        verdict = backup.decide(repository, self.name, primary_report, credentials_problem)
        await backup.report(self, self.r.backup, verdict)
        await recovery.report(self, restore)
        await restore_test.run(self, data.major, archiving=archive is not None)  # a rehearsal due, running or done
        await backup_schedule.run(self, repository)  # the first and the scheduled base backups; their summary
        return self.next_look(step)

    async def look(self) -> Seen:
        """The instances' reports and pods, their claims; who is primary, and a second primary fenced."""
        raw, pods = await observe(self)
        claims = claims_of(self)
        existing = self.existing_instances()
        marked = rejoining(claims)  # former primaries: never a primary again until they rejoined
        reports = withhold_rejoining(raw, marked)
        recorded = recorded_primary(claims.values())
        verdict = decide(reports, recorded=recorded, status=self.status.get("currentPrimary"),
                         instances=existing)  # fmt: skip
        await fence_rogues(self, verdict, pods)
        reports = routed(reports, verdict)  # from here on a fenced instance is never read as a primary
        split_brain = next_record(self.status.get("splitBrain"), verdict, reports, existing, datetime.now(UTC))
        return Seen(raw=raw, reports=reports, pods=pods, claims=claims, existing=existing, marked=marked,
                    recorded=recorded, verdict=verdict, split_brain=split_brain)  # fmt: skip

    async def fail_over(self, seen: Seen) -> StepResult:
        """The failover step (:mod:`kanri.postgres.ha.failover_step`); the cluster as it last wrote it."""
        designated = seen.verdict.primary or seen.recorded or self.status.get("currentPrimary")
        self.failover = FailoverStep(self.r, self.cluster, self.spec, primary=designated, instances=seen.existing,
                                     reports=seen.reports, raw=seen.raw, pods=seen.pods,
                                     claims=seen.claims)  # fmt: skip
        step = await self.failover.run()
        self.cluster = step.cluster
        self.status = step.cluster.get("status") or {}
        if not step.promoted:
            self.problems.extend(step.problems)
        return step

    async def the_data(self, seen: Seen) -> Data:
        """The instance plan, the data's identity and major (recorded onto the claims first)."""
        plan = self.plan(seen.verdict.primary, seen.claims)
        await self.record(seen.claims, seen.reports, plan.primary)
        system_identifier = self.system_identifier(seen.claims, plan, seen.reports)
        recorded_data = recorded_major(seen.claims, plan.primary)
        major = running_major(recorded_data, seen.reports, self.status.get("postgresMajor"), self.spec.version)
        plan, removal_waiting = gate_removals(plan, seen.reports)  # a replica goes only once proven a replica
        return Data(plan=plan, major=major, system_identifier=system_identifier, removal_waiting=removal_waiting)

    def synchronous_standbys(self, seen: Seen, plan: InstancePlan) -> sync_durability.Durability:
        """The number for ``synchronous_standby_names``, from the primary's report and the ConfigMap's number."""
        primary = plan.primary
        streaming = None if primary is None else sync_durability.streaming_standbys(
            seen.reports.get(primary), primary, plan.instances)  # fmt: skip
        current = self.cache.get(CONFIG_MAP, names.config_map(self.name), self.namespace)
        return sync_durability.decide(self.spec, streaming, sync_durability.in_force(current))

    async def converge(self, seen: Seen, data: Data, restore: Restore, *, failing_over: bool,
                       held: Collection[str] = ()) -> Changes:  # fmt: skip
        """Scale, roll out the instances, budgets, volumes, role labels, restarts and the primary's update."""
        changes = Changes()
        if not failing_over:
            changes.scaled = await topology_step.scale(self, data.plan)
            if not restore.blocked:
                await self.instances(data.plan, data.major)
            serving = (primary := seen.reports.get(data.plan.primary or "")) is not None and primary.ready
            await topology_step.budgets(self, data.plan, serving=serving)
            changes.storage = await topology_step.storage(self, data.plan)
        topology_step.check_storage_class(self, data.plan)
        fenced = fenced_names(seen.split_brain) | set(seen.marked)
        self.reads = read_lag(seen.reports, data.plan.primary, self.spec.replication.read_lag_bound)
        await label_pods(self, data.plan, seen.reports, seen.pods, fenced, self.reads.withheld, held)
        await pod_metadata.apply(self, seen.pods)  # podTemplate labels/annotations onto the pods, no restart
        if not failing_over:
            changes.restarting = await self.restart(data.plan, seen.reports)
            await self.leave_cordoned_node(data.plan, seen)
            await self.settle_primary_update()
        return changes

    async def routing_to_primary(self, seen: Seen, plan: InstancePlan) -> str | None:
        """Why ``-rw`` does not route to the primary yet; its EndpointSlices are read only around a change."""
        if not self.running:
            return None
        ready = get_condition(self.status.get("conditions") or [], "Ready") or {}
        last = parse_optional_time(str((self.status.get("lastFailover") or {}).get("time") or ""))
        recent = last is not None and datetime.now(UTC) - last < SWITCHOVER_SETTLE
        changed = ready.get("status") != "True" or self.status.get("currentPrimary") != plan.primary or recent
        return await unrouted(self, plan.primary, seen.pods, slices=changed)

    def find_problems(self, seen: Seen) -> None:
        """What the cache and the reports show wrong (beyond what the steps found as they went)."""
        self.problems.extend(credentials_step.problems(self))
        self.problems.extend(oneshot.foreign_in(self))  # a pod someone else made under a one-shot pod's name
        if (split := split_brain_problem(seen.split_brain)) is not None:
            self.problems.append(split)
        memory = self.r.answers.of(self.cluster)
        if (lagging := withheld_problem(self.reads.withheld, seen.reports, memory.withheld)) is not None:
            self.problems.append(lagging)
        memory.withheld = frozenset(self.reads.withheld)
        if self.durability is not None and (reduced := sync_durability.problem(self.durability)) is not None:
            self.problems.append(reduced)
        known = {p.subject for p in self.problems if p.subject is not None}
        self.problems.extend(report_problems(seen.reports, known=known))
        self.problems.extend(pod_problems(seen.pods, seen.claims, datetime.now(UTC), storage_classes={
            c["metadata"]["name"]: c for c in self.cache.list(STORAGE_CLASS)}))  # fmt: skip

    def observation(self, seen: Seen, data: Data, changes: Changes, step: StepResult) -> Observation:
        """Everything the status reports of this pass."""
        approved = self.spec.upgrade.approved_version if self.spec.upgrade else None
        # one missed /status answer is not yet a not-ready instance (cluster/answers.py); the lag as the primary sees it
        reports = with_grace(self.r.answers.of(self.cluster), seen.reports, seen.pods)
        lag = read_lag(reports, data.plan.primary, self.spec.replication.read_lag_bound).lag
        return Observation(plan=data.plan, hibernated=not self.running, reports=reports, pods=seen.pods, lag=lag,
                           generation=int(self.cluster["metadata"].get("generation", 0)), storage=changes.storage,
                           scaled=changes.scaled, restarting=changes.restarting, rolling=self.rolling,
                           waiting_to_roll=tuple(self.waiting_to_roll), problems=tuple(self.problems),
                           removal_waiting=data.removal_waiting, major=data.major,
                           upgrade=upgrade_verdict(data.major, self.spec.version, approved,
                                                   upgrade_step.repository_missing(self)),
                           system_identifier=data.system_identifier, split_brain=seen.split_brain,
                           unrouted=self.unrouted,
                           failover=step.progress, primary_waiting=self.primary_waiting,
                           upgrading=upgrade_step.in_progress(self.status))  # fmt: skip

    def next_look(self, step: StepResult) -> Result:
        """When to look again: soon while a child is blocked, a failover or an upgrade runs; else the refresh."""
        if self.blocked:
            return Result(requeue_after=_RETRY_BLOCKED)
        wait = self.r.refresh
        if step.requeue is not None:
            wait = min(wait, step.requeue)
        if self.upgrade_busy:
            wait = min(wait, _UPGRADE_POLL)
        if self.unrouted is not None:
            wait = min(wait, _ROUTE_POLL)
        return Result(requeue_after=wait)

    def existing_instances(self) -> list[str]:
        """Instances with a volume or a StatefulSet (not being deleted): they hold data or run."""
        return existing_instances(self)

    # --- writes that may be refused --------------------------------------------------------------------------------

    async def write(self, kind: Kind, name: str, request: Awaitable[Any]) -> bool:
        """Send one write of a child; a refusal becomes a problem (True: it went through)."""
        try:
            await request
        except ApiError as exc:
            self.rejected(kind, name, exc)
            return False
        return True

    def rejected(self, kind: Kind, name: str, exc: ApiError) -> None:
        """Record the API server's refusal of a child write; throttling and an unavailable server are retried."""
        if exc.status in _RETRIED_STATUSES:
            raise exc
        log.warning("child write refused", kind=kind.kind, child=name, status=exc.status, error=exc.message)
        self.problems.append(child_rejected(kind.kind, name, exc))

    async def apply(self, kind: Kind, desired: Obj) -> str:
        name = desired["metadata"]["name"]
        try:
            outcome = await ensure(self.client, self.cache, kind, desired, self.uid)
        except ApiError as exc:
            self.rejected(kind, name, exc)
            return "rejected"
        if outcome == "blocked":
            self.explain_blocked(kind, name)
        return outcome

    def explain_blocked(self, kind: Kind, name: str) -> None:
        """A child of our name that another object controls: say which. Only an owner already gone from the cache
        (the garbage collector removes its children within seconds) is worth looking again soon."""
        current = self.cache.get(kind, name, self.namespace) or {}
        ref = controller_of(current) or {}
        owner = f"{ref.get('kind', 'an object')} {ref.get('name', '?')}"
        if ref.get("kind") == POSTGRES_CLUSTER.kind:
            live = next((c for c in self.cache.list(POSTGRES_CLUSTER, self.namespace)
                         if c["metadata"].get("uid") == ref.get("uid")), None)  # fmt: skip
            if live is None:
                self.blocked.append(f"{kind.kind} {name}")
                log.info("child still controlled by a deleted owner; waiting for garbage collection",
                         kind=kind.kind, child=name, owner=owner)  # fmt: skip
                return
            if live["metadata"].get("deletionTimestamp"):
                owner += " (being deleted)"
        log.warning("child controlled by another object; not taken over", kind=kind.kind, child=name, owner=owner)
        self.problems.append(child_conflict(kind.kind, name, owner))

    # --- step 4/5: children ----------------------------------------------------------------------------------------

    def plan(self, reported: str | None, claims: dict[str, Obj]) -> InstancePlan:
        existing = self.existing_instances()
        primary = choose_primary(existing, reported, recorded=recorded_primary(claims.values()),
                                 status=self.status.get("currentPrimary"),
                                 bootstrapping=bootstrapping_primary(self))  # fmt: skip
        return plan_instances(self.name, self.spec.replicas, existing, primary)

    async def record(self, claims: dict[str, Obj], reports: dict[str, InstanceReport], primary: str | None) -> None:
        """What the reports say about the data (last primary, major, system identifier), onto the claims."""
        for name, patch in annotation_patches(claims, reports, primary).items():
            await self.write(PVC, name, self.client.patch(PVC, name, patch, self.namespace))

    def system_identifier(
        self, claims: dict[str, Obj], plan: InstancePlan, reports: dict[str, InstanceReport]
    ) -> str | None:
        """The cluster's identifier: as recorded on the claims, else in status, else as its primary reports it."""
        recorded = recorded_system_identifier(claims, plan.primary) or self.status.get("systemIdentifier")
        if recorded:
            return str(recorded)
        report = reports.get(plan.primary) if plan.primary else None
        return report.system_identifier if report is not None and report.role == PRIMARY else None

    async def shared_children(
        self, plan: InstancePlan, system_identifier: str | None, archive: Obj | None, restore: Obj | None = None
    ) -> None:
        """The ConfigMap (parameters, instance list, system identifier, archive target, recovery source), the
        instances' ServiceAccount, the three Services and the NetworkPolicy."""
        document = config_map(self.cluster, self.spec, plan.instances, system_identifier, archive, restore,
                              upgrade=upgrade_step.config_note(self.status),
                              synchronous=None if self.durability is None else self.durability.count)  # fmt: skip
        await self.apply(CONFIG_MAP, document)
        await self.apply(SERVICE_ACCOUNT, service_account(self.cluster))  # and no Role: children/rbac.py says why
        # by app name too once no pod relies on the older selectors (docs/postgres-operator.md, "Labels and selectors")
        by_reads = cluster_routes_by_reads(self.cache, self.cluster)  # once every pod carries kanri.dev/reads
        for service in services(self.cluster, by_app=cluster_routes_by_app(self.cache, self.cluster),
                                by_reads=by_reads):  # fmt: skip
            await self.apply(SERVICE, service)
        isolated = isolates_by_app(self.cache.owned_by(STATEFUL_SET, self.uid))
        await self.apply(NETWORK_POLICY, network_policy(self.cluster, operator_namespace=self.r.operator_namespace,
                                                        by_app=isolated))  # fmt: skip

    async def ensure_claim(self, instance: str) -> bool:
        """The instance's claim exists (created once, never owned); False when it cannot be made.

        A claim deleted under a StatefulSet of ours is a lost volume: said so (``VolumeLost``), and replaced by an
        empty one — the instance then clones from the primary, or reports ``DataDirectoryLost``: never initdb, since
        the ConfigMap carries the cluster's system identifier."""
        current = self.cache.get(PVC, instance, self.namespace)
        sts = self.cache.get(STATEFUL_SET, instance, self.namespace)
        had_volume = sts is not None and is_controlled_by(sts, self.cluster)
        if current is not None:
            if current["metadata"].get("deletionTimestamp") and had_volume:
                self.problems.append(volume_lost(instance))
            elif labels := missing_labels(current, self.name):  # made before the app labels: labelled in place
                await self.write(PVC, instance, self.client.patch(PVC, instance, {"metadata": {"labels": labels}},
                                                                  self.namespace))  # fmt: skip
            return True
        storage_class = self.spec.storage.storage_class_name
        try:
            await self.client.create(PVC, claim(self.cluster, instance, self.spec.storage.size, storage_class))
        except ApiError as exc:
            if exc.status == 409:
                return True  # the cache had not seen it yet
            self.rejected(PVC, instance, exc)
            return False
        if had_volume:
            self.problems.append(volume_lost(instance))
        return True

    async def instances(self, plan: InstancePlan, major: int) -> None:
        """Each instance's claim and StatefulSet (1 replica, 0 while hibernated), on the data's major.

        A changed pod template (resources, placement, image settings) restarts the pod, so it is rolled out one
        instance at a time, replicas first and the primary last, each only once every instance is Ready again; the
        primary's turn hands its role to an updated replica first (``primary_update.py``)."""
        settled: bool | None = None
        up_to_date: set[str] = set()
        for instance in rollout.rollout_order(self, plan):
            if not await self.ensure_claim(instance):
                continue  # a pod without its volume would only wait
            current = self.cache.get(STATEFUL_SET, instance, self.namespace)
            kept = bootstrap_role(current) if current is not None and is_controlled_by(current, self.cluster) else None
            role = kept or (PRIMARY if instance == plan.primary else REPLICA)
            image = postgres_image(self.spec, major, current, self.images)
            desired = statefulset(self.cluster, self.spec, instance, role=role, image=image, running=self.running,
                                  by_app=statefulset_by_app(current))  # an older one keeps its selector  # fmt: skip
            desired = pod_metadata.kept_template(desired, current, pod_metadata.wanted(self.spec))  # no roll for it
            # An image of another major (a hand edit) is reverted at once: that pod cannot open its data, so waiting
            # for it to become ready first would wait forever.
            wrong_major = current is not None and image_major(current) != major
            if rollout.restarts_pod(self, current, desired) and not wrong_major:
                settled = rollout.settled(self, plan) if settled is None else settled
                self.primary_behind = self.primary_behind or instance == plan.primary
                if self.rolling is not None or not (settled or rollout.broken_replica(self, plan, instance)):
                    self.waiting_to_roll.append(instance)
                    continue
                if instance == plan.primary and await self.switch_primary(plan, up_to_date, "RollingUpdate"):
                    self.waiting_to_roll.append(instance)
                    continue
                self.rolling = instance
            elif current is not None:
                up_to_date.add(instance)
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

    # --- step 5: instances -----------------------------------------------------------------------------------------

    async def restart(self, plan: InstancePlan, reports: dict[str, InstanceReport]) -> str | None:
        """Restart one instance whose parameters need it (replicas first, the primary last)."""
        primary = next((n for n, r in reports.items() if r.role == "primary"), plan.primary)
        pending = frozenset(name for name, r in reports.items() if r.pending_restart)
        memory = self.r.restarts.of(self.cluster)
        seen = memory.pending
        if seen is None or seen[0] != pending:
            memory.pending = seen = (pending, self.r.clock())
        if pending and self.r.clock() - seen[1] < _RESTART_SETTLE:
            return None  # every instance may not have read the change yet
        if (report := reports.get(primary or "")) is None or report.pending_restart:
            self.primary_behind = True  # (not answering: not known to be through either)
        if self.switching is not None:
            return None  # never two at once: the rollout began a switchover
        target = next_restart(plan.instances, primary, reports)
        if target is None:
            return None
        if target == primary and not reports[primary].pending_lowers:  # lowering limits: primary first, in place
            fresh = primary_update.restart_up_to_date(plan.instances, reports)
            if await self.switch_primary(plan, fresh, "PendingRestart"):
                return None
        asked = memory.requested.get(target)
        if asked is not None and self.r.clock() - asked < _RESTART_COOLDOWN:
            return target
        endpoint = instance_endpoint(self.cache, self.namespace, self.name, target)
        if endpoint is None:
            return None
        if await self.r.instances.restart(*endpoint):
            memory.requested[target] = self.r.clock()
            await self.r.events.normal(self.cluster, "RestartingInstance",
                                       f"restarting {target} to apply parameters that need a restart")  # fmt: skip
        return target

    async def switch_primary(self, plan: InstancePlan, up_to_date: set[str], reason: primary_update.PlannedReason
                             ) -> bool:  # fmt: skip
        """The primary is next to be updated: True when that waits for a switchover (begun now, or one for this spec
        failed: ``status.primaryUpdate``); False to update it in place (strategy InPlace, or no replica to hand
        the role to)."""
        if self.spec.primary_update_strategy != "Switchover" or self.failover is None:
            return False
        record = self.status.get("primaryUpdate")
        generation = int(self.cluster["metadata"].get("generation", 0))
        if primary_update.record_blocks(record, generation):
            assert record is not None
            self.primary_waiting = primary_update.waiting_message(record, str(plan.primary))
            return True
        if self.failover.primary != plan.primary or self.failover.token is None:
            return False
        target = primary_update.switchover_target(plan.primary, plan.instances, self.failover.reports, up_to_date)
        if target is None:
            return False
        self.switching = await self.failover.planned_switchover(target, reason)
        return self.switching is not None

    async def leave_cordoned_node(self, plan: InstancePlan, seen: Seen) -> None:
        """A primary whose node is cordoned (a drain begins) hands its role to a replica elsewhere first, so the drain
        is not held by the primary's budget (:mod:`kanri.postgres.ha.maintenance`)."""
        failover = self.failover
        if self.switching is not None or failover is None or failover.token is None or plan.primary is None:
            return
        if failover.primary != plan.primary or len(plan.instances) < 2:
            return
        found = await maintenance_target(self, self.r.ha.of(self.cluster), self.r.clock(), plan.primary,
                                         plan.instances, seen.reports, seen.pods)  # fmt: skip
        if found is not None:
            self.switching = await failover.planned_switchover(found[0], "NodeMaintenance")

    async def settle_primary_update(self) -> None:
        """``status.primaryUpdate`` goes once the primary has everything its replicas have, or the spec changed."""
        record = self.status.get("primaryUpdate")
        if record is None or self.primary_waiting is not None:
            return
        if self.primary_behind and self.switching is None:
            return  # the update is not through yet (the replicas may still be rolling)
        updated = await self.client.patch_status(POSTGRES_CLUSTER, self.name, {"status": {"primaryUpdate": None}},
                                                 self.namespace)  # fmt: skip
        self.cluster = {**self.cluster, "metadata": updated.get("metadata", self.cluster["metadata"]),
                        "status": updated.get("status") or {}}  # fmt: skip
        self.status = self.cluster["status"]

    # --- step 6: status and events ---------------------------------------------------------------------------------
