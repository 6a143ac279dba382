"""The PostgresCluster reconciler: the seed's six steps, one guarded step per concern.

``reconcile`` loads the cluster from the cache and handles deletion (steps 1-2); :class:`ClusterPass` runs the rest
for one pass over one cluster: validate (3), build the children with deterministic names and compare them with the
cache (4), write only what differs and observe the instances (5), then write status and Events and ask to look again
in ``refresh`` seconds, since the instances' state is not something Kubernetes can watch (6).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from kanri.postgres import names
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.backup import archiving as backup
from kanri.postgres.backup import schedule as backup_schedule
from kanri.postgres.backup.archiving import BackupSettings
from kanri.postgres.backup.cleanup import BackupCleanup
from kanri.postgres.children.config import config_map
from kanri.postgres.children.images import DEFAULT_IMAGES, PostgresImages
from kanri.postgres.children.networkpolicy import OPERATOR_NAMESPACE, network_policy
from kanri.postgres.children.pdb import disruption_budgets, wants_budgets
from kanri.postgres.children.pvc import claim
from kanri.postgres.children.rbac import service_account
from kanri.postgres.children.services import services
from kanri.postgres.children.statefulset import bootstrap_role, image_major, postgres_image, statefulset
from kanri.postgres.cluster.deletion import FINALIZER, cleanup
from kanri.postgres.cluster.diff import is_subset
from kanri.postgres.cluster.instances import InstanceClient, InstanceReport, gather_reports
from kanri.postgres.cluster.pod_problems import pod_problems
from kanri.postgres.cluster.problems import (
    Problem,
    child_conflict,
    child_rejected,
    ordered,
    report_problems,
    secret_problems,
    storage_class_missing,
    volume_lost,
)
from kanri.postgres.cluster.recorded import (
    annotation_patches,
    recorded_major,
    recorded_primary,
    recorded_system_identifier,
)
from kanri.postgres.cluster.status import Observation, compute_status, condition_flipped, status_patch
from kanri.postgres.cluster.sync import ensure
from kanri.postgres.credentials.secrets import desired_secrets, secret_value
from kanri.postgres.ha import primary_update
from kanri.postgres.ha.failover import SUSPECT_INTERVAL
from kanri.postgres.ha.failover_step import FailoverStep, StepResult
from kanri.postgres.ha.memory import HaMemory
from kanri.postgres.ha.primary import choose_primary, gate_removals
from kanri.postgres.ha.rejoin import rejoining, withhold_rejoining
from kanri.postgres.ha.splitbrain import HELP, Verdict, decide, fenced_names, next_record, routed, split_brain_problem
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.postgres.labels import (
    FENCED,
    PRIMARY,
    REPLICA,
    ROLE,
    belongs,
    cluster_routes_by_app,
    isolates_by_app,
    missing_labels,
    of_cluster,
    runs_instance,
    statefulset_by_app,
)
from kanri.postgres.metrics import PostgresMetrics
from kanri.postgres.pods import oneshot
from kanri.postgres.pods import policy as pod_policy
from kanri.postgres.recovery import bootstrap as recovery
from kanri.postgres.recovery import rehearsal as restore_test
from kanri.postgres.tls.step import ensure_tls
from kanri.postgres.topology.plan import InstancePlan, plan_instances
from kanri.postgres.topology.restarts import next_restart
from kanri.postgres.topology.storage import StoragePlan, plan_storage
from kanri.postgres.upgrade import machine as upgrade
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
    finalizer_step,
    get_condition,
    is_controlled_by,
    remove_finalizer,
)
from kanri.runtime.kinds import (
    CONFIG_MAP,
    NETWORK_POLICY,
    POD,
    POD_DISRUPTION_BUDGET,
    PVC,
    SECRET,
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
_RETRIED_STATUSES = frozenset({429, 503, 504})  # throttled or unavailable: retried with backoff, not a refusal
_RESTART_COOLDOWN = 60.0  # do not ask the same instance to restart again before it had time to report
# A changed ConfigMap reaches the instance managers a few config intervals (2 s) apart: restart only once the set of
# instances reporting a pending restart has held that long, or a replica that saw a lowered max_connections first is
# restarted before its primary reports it (CI caught the replica crash-looping on "insufficient parameter settings").
_RESTART_SETTLE = 8.0


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
        self.images = DEFAULT_IMAGES
        """The PostgreSQL images per major (the platform's configuration, :mod:`kanri.postgres.children.images`)."""
        self.cache = cache
        self.client = client
        self.instances = instances
        self.events = events or EventRecorder(client, component="kanri-postgres")
        self.refresh = refresh
        self.clock = clock
        self.restart_requests: dict[tuple[str, str], float] = {}
        self.ha = HaMemory()
        """Failover memory, per cluster (losing it only delays a failover, never hastens one)."""
        self.background: set[asyncio.Task[None]] = set()
        """Requests that must not hold a pass up (fencing a primary that does not answer)."""
        self.pending_since: dict[tuple[str, str], tuple[frozenset[str], float]] = {}
        """Per cluster: which instances report a pending restart, and since when (see ``_RESTART_SETTLE``)."""
        """(namespace, instance) -> when a restart was last requested (kept in memory: losing it costs one more
        request after an operator restart, which the instance answers harmlessly)."""

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
            self.ha.forget(request.namespace, request.name)
            return None  # gone: owned children follow through garbage collection, the data stayed or went already
        # Steps 1-2: a cluster being deleted gets its deletionPolicy carried out, then is let go.
        match finalizer_step(cluster, FINALIZER):
            case "done":
                await self.mark_deleting(cluster)  # another finalizer still holds it
                return None
            case "cleanup":
                if self.metrics is not None:
                    deleted = datetime.fromisoformat(cluster["metadata"]["deletionTimestamp"].replace("Z", "+00:00"))
                    self.metrics.deleting(cluster, deleted.timestamp())
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
    def events(self) -> EventRecorder:
        return self.r.events

    @property
    def metrics(self) -> PostgresMetrics | None:
        return self.r.metrics

    @property
    def backup_settings(self) -> BackupSettings:
        return self.r.backup

    def adopt_status(self, updated: Obj) -> None:
        """A concern's step wrote status: later steps of this pass read what it returned, not the cache's copy."""
        self.status = updated.get("status") or {}
        self.cluster = {**self.cluster, "status": self.status}

    async def run(self) -> Result:
        await self.credentials()  # before any pod that mounts them
        # CA, server certificate; a TLS Secret that is wrong is named (InvalidServerSecret), never trusted
        self.problems.extend(await ensure_tls(self, self.spec.replicas, self.r.instances, self.r.metrics))
        # Where WAL goes (the cluster's repository or the platform's), its key pair copied before pods mount it.
        repository = backup.resolve(self.spec, self.namespace, self.r.backup)
        credentials_problem = await backup.ensure_credentials(self, repository)
        # Observe first: which instance is primary, and what the data is, come from the instances themselves.
        raw, pods = await self.observe()
        claims = self.claims()
        existing = self.existing_instances()
        marked = rejoining(claims)  # former primaries: never a primary again until they rejoined
        reports = withhold_rejoining(raw, marked)
        recorded = recorded_primary(claims.values())
        verdict = decide(reports, recorded=recorded, status=self.status.get("currentPrimary"),
                         instances=existing)  # fmt: skip
        # A second primary is fenced before anything else this pass: routing first, then its PostgreSQL stopped.
        await self.fence_rogues(verdict, pods)
        reports = routed(reports, verdict)  # from here on a fenced instance is never read as a primary
        split_brain = next_record(self.status.get("splitBrain"), verdict, reports, existing, datetime.now(UTC))
        # The primary failed (or a switchover was asked): fence, elect, promote — before anything else changes.
        designated = verdict.primary or recorded or self.status.get("currentPrimary")
        self.failover = FailoverStep(self.r, self.cluster, self.spec, primary=designated, instances=existing,
                                     reports=reports, raw=raw, pods=pods, claims=claims)  # fmt: skip
        step = await self.failover.run()
        self.cluster = step.cluster
        self.status = step.cluster.get("status") or {}
        if step.promoted:
            return Result(requeue_after=SUSPECT_INTERVAL)  # the next pass sees the new primary's claim and report
        self.problems.extend(step.problems)
        plan = self.plan(verdict.primary, claims)
        await self.record(claims, reports, plan.primary)
        system_identifier = self.system_identifier(claims, plan, reports)
        recorded_data = recorded_major(claims, plan.primary)
        major = running_major(recorded_data, reports, self.status.get("postgresMajor"), self.spec.version)
        plan, removal_waiting = gate_removals(plan, reports)  # a replica goes only once proven a replica
        archive = backup.archive_target(repository, backup.server_name(self.cluster))
        # bootstrap.recovery: where the source's backups are; no instance before that is known (it would initdb)
        restore = await recovery.prepare(self, self.r.backup, archive, initialised=system_identifier is not None)
        await self.shared_children(plan, system_identifier, archive, restore.entry)
        restarting: str | None = None
        storage = StoragePlan()
        scaled = False
        if not step.active:  # a failover in progress changes nothing else: no rollout, scale-down or restart
            scaled = await self.scale(plan)
            if not restore.blocked:
                await self.instances(plan, major)
            await self.budgets(plan)
            storage = await self.storage(plan)
        self.check_storage_class(plan)
        await self.label_pods(plan, reports, pods, fenced_names(split_brain) | set(marked))
        if not step.active:
            restarting = await self.restart(plan, reports)
            await self.settle_primary_update()
        if self.switching is not None:  # the primary's update began a switchover: report it as one
            step = self.switching
            self.cluster, self.status = step.cluster, step.cluster.get("status") or {}
        self.check_secrets()
        self.problems.extend(oneshot.foreign_in(self))  # a pod someone else made under a one-shot pod's name
        if (split := split_brain_problem(split_brain)) is not None:
            self.problems.append(split)
        known = {p.subject for p in self.problems if p.subject is not None}
        self.problems.extend(report_problems(reports, known=known))
        self.problems.extend(pod_problems(pods, claims, datetime.now(UTC), storage_classes={
            c["metadata"]["name"]: c for c in self.cache.list(STORAGE_CLASS)}))  # fmt: skip
        approved = self.spec.upgrade.approved_version if self.spec.upgrade else None
        observation = Observation(plan=plan, hibernated=not self.running, reports=reports, pods=pods,
                                  generation=int(self.cluster["metadata"].get("generation", 0)), storage=storage,
                                  scaled=scaled, restarting=restarting, rolling=self.rolling,
                                  waiting_to_roll=tuple(self.waiting_to_roll), problems=tuple(self.problems),
                                  removal_waiting=removal_waiting, major=major,
                                  upgrade=upgrade_verdict(major, self.spec.version, approved),
                                  system_identifier=system_identifier, split_brain=split_brain,
                                  failover=step.progress, primary_waiting=self.primary_waiting,
                                  upgrading=upgrade_step.in_progress(self.status))  # fmt: skip
        await self.report(observation)
        await self.upgrade(major, plan, reports)  # status.upgrade: approval, gates, check, pg_upgrade
        primary_report = reports.get(plan.primary) if plan.primary else None
        await backup.report(
            self, self.r.backup, backup.decide(repository, self.name, primary_report, credentials_problem)
        )
        await recovery.report(self, restore)
        await restore_test.run(self, major, archiving=archive is not None)  # a rehearsal due, running or done
        await backup_schedule.run(self, repository)  # the first and the scheduled base backups; their summary
        if self.blocked:
            return Result(requeue_after=_RETRY_BLOCKED)
        wait = self.r.refresh
        if step.requeue is not None:
            wait = min(wait, step.requeue)
        if self.upgrade_busy:
            wait = min(wait, _UPGRADE_POLL)
        return Result(requeue_after=wait)

    async def upgrade(self, major: int, plan: InstancePlan, reports: dict[str, InstanceReport]) -> None:
        """The major upgrade's record (``status.upgrade``) as :func:`kanri.postgres.upgrade.machine.decide` wants it,
        written before anything acts on it, with a Normal Event when its phase changes; then the check or the
        upgrade's next step (:mod:`kanri.postgres.upgrade.step`)."""
        status = self.cluster.get("status") or {}
        ready = get_condition(status.get("conditions") or [], "Ready") or {}
        last_backup = (status.get("backup") or {}).get("lastSuccessful")
        decision = upgrade.decide(upgrade.Observed(
            running=major, version=self.spec.version,
            approved=self.spec.upgrade.approved_version if self.spec.upgrade else None,
            generation=int(self.cluster["metadata"].get("generation", 0)),
            ready=ready.get("status") == "True" and plan.primary is not None,
            last_backup=datetime.fromisoformat(last_backup.replace("Z", "+00:00")) if last_backup else None,
            record=status.get("upgrade"), now=datetime.now(UTC).replace(microsecond=0),
            backups_in_flight=self.backups_in_flight()))  # fmt: skip
        old = status.get("upgrade")
        if decision.record != old:
            patch = decision.record
            if patch is not None and old:  # a merge patch: fields the new record lacks are removed
                patch = {**{key: None for key in old if key not in patch}, **patch}
            updated = await self.client.patch_status(POSTGRES_CLUSTER, self.name, {"status": {"upgrade": patch}},
                                                     self.namespace)  # fmt: skip
            self.status = updated.get("status") or {}
            self.cluster = {**self.cluster, "status": self.status}
            if decision.event is not None:
                await self.r.events.normal(self.cluster, *decision.event)
        record = self.status.get("upgrade")
        await upgrade_step.sweep(self, record)
        if record is None or decision.action == "none":
            return
        self.upgrade_busy = True
        if decision.action == "check":
            await upgrade_step.check(self, dict(record), plan.primary)
        else:
            await upgrade_step.advance(self, dict(record), plan, reports)

    def backups_in_flight(self) -> tuple[str, ...]:
        """The cluster's PostgresBackups that are Pending or Running."""
        found = self.cache.list(POSTGRES_BACKUP, self.namespace)
        return tuple(sorted(b["metadata"]["name"] for b in found if (b.get("spec") or {}).get("cluster") == self.name
                            and (b.get("status") or {}).get("phase", "Pending") in ("Pending", "Running")))  # fmt: skip

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

    async def credentials(self) -> None:
        """Generate each missing credential Secret once; an existing one is adopted as it is."""
        for wanted in desired_secrets(self.name, self.owner):
            if self.cache.get(SECRET, wanted.name, self.namespace) is not None:
                continue
            try:
                await self.client.create(SECRET, wanted.build(self.name, self.namespace))
            except ApiError as exc:
                if exc.status != 409:
                    self.rejected(SECRET, wanted.name, exc)
                continue  # exists, the cache had not seen it yet: adopted, never overwritten
            await self.r.events.normal(self.cluster, "CreatedSecret", f"generated Secret {wanted.name}")

    @property
    def owner(self) -> str:
        return self.spec.bootstrap.initdb.owner if self.spec.bootstrap.initdb else "app"

    def check_secrets(self) -> None:
        """Every adopted credential Secret against the contract (from the cache: costs no request)."""
        wanted = [s.name for s in desired_secrets(self.name, self.owner)]
        found = {name: self.cache.get(SECRET, name, self.namespace) for name in wanted}
        self.problems.extend(secret_problems(self.name, found, self.owner))

    def existing_instances(self) -> list[str]:
        """Instances with a volume or a StatefulSet (not being deleted): they hold data or run."""
        claims = of_cluster(self.cache, PVC, self.namespace, self.name)
        sets = self.cache.owned_by(STATEFUL_SET, self.uid)
        found = [o["metadata"]["name"] for o in [*claims, *sets] if not o["metadata"].get("deletionTimestamp")]
        return sorted({n for n in found if names.instance_number(self.name, n) is not None})

    def claims(self) -> dict[str, Obj]:
        """The instances' claims in the cache, by name (those being deleted too: their records still count)."""
        found = of_cluster(self.cache, PVC, self.namespace, self.name)
        return {c["metadata"]["name"]: c for c in found if names.instance_number(self.name, c["metadata"]["name"])}

    def plan(self, reported: str | None, claims: dict[str, Obj]) -> InstancePlan:
        existing = self.existing_instances()
        primary = choose_primary(existing, reported, recorded=recorded_primary(claims.values()),
                                 status=self.status.get("currentPrimary"),
                                 bootstrapping=self.bootstrapping_primary())  # fmt: skip
        return plan_instances(self.name, self.spec.replicas, existing, primary)

    def bootstrapping_primary(self) -> str | None:
        """Before any instance has reported (status names no primary): the instance already told to bootstrap as
        primary, if an earlier pass — perhaps of an operator killed midway — created one. Choosing another would
        leave every instance waiting to clone from a primary that never initialises."""
        for sts in self.cache.owned_by(STATEFUL_SET, self.uid):
            if bootstrap_role(sts) == PRIMARY and not sts["metadata"].get("deletionTimestamp"):
                return str(sts["metadata"]["name"])
        return None

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
                              upgrade=upgrade_step.config_note(self.status))  # fmt: skip
        await self.apply(CONFIG_MAP, document)
        await self.apply(SERVICE_ACCOUNT, service_account(self.cluster))  # and no Role: children/rbac.py says why
        # by app name too once no pod relies on the older selectors (docs/postgres-operator.md, "Labels and selectors")
        for service in services(self.cluster, by_app=cluster_routes_by_app(self.cache, self.cluster)):
            await self.apply(SERVICE, service)
        isolated = isolates_by_app(self.cache.owned_by(STATEFUL_SET, self.uid))
        await self.apply(NETWORK_POLICY, network_policy(self.cluster, operator_namespace=self.r.operator_namespace,
                                                        by_app=isolated))  # fmt: skip

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
                deleted = self.client.delete(STATEFUL_SET, instance, self.namespace, propagation_policy="Background")
                if not await self.write(STATEFUL_SET, instance, deleted):
                    continue  # the volume goes only after its pod
            if self.cache.get(PVC, instance, self.namespace) is not None:
                claim_deleted = self.client.delete(PVC, instance, self.namespace)
                if not await self.write(PVC, instance, claim_deleted):
                    continue
            await self.r.events.normal(self.cluster, "RemovedInstance", f"removed replica {instance} and its volume")
        return scaling

    def settled(self, plan: InstancePlan) -> bool:
        """Every instance's StatefulSet has rolled out its current template and its pod is Ready."""
        return all(self.instance_settled(instance) for instance in plan.instances)

    def instance_settled(self, instance: str) -> bool:
        """The instance's StatefulSet has rolled out its current template and its pod is Ready."""
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
        return ready is not None and ready["status"] == "True"

    def broken_replica(self, plan: InstancePlan, instance: str) -> bool:
        """A replica that serves nothing — its StatefulSet rolled out the template it has, and its pod is not Ready
        with it. Restarting it costs no availability, while waiting for the cluster to settle first would wait
        forever when that template is what breaks it (an image the nodes cannot pull, say): the fix could never
        roll out, the StatefulSet controller's own "forced rollback" trap. The primary is never restarted so."""
        if instance == plan.primary:
            return False
        sts = self.cache.get(STATEFUL_SET, instance, self.namespace)
        pod = self.cache.get(POD, names.pod_name(instance), self.namespace)
        if sts is None or pod is None or pod["metadata"].get("deletionTimestamp"):
            return False
        status = sts.get("status") or {}
        revision = (pod["metadata"].get("labels") or {}).get("controller-revision-hash")
        has_the_template = (
            status.get("observedGeneration") == sts["metadata"].get("generation")
            and revision is not None
            and revision == status.get("updateRevision")
        )
        return has_the_template and not self.instance_settled(instance)

    def rollout_order(self, plan: InstancePlan) -> list[str]:
        """Replicas first and the primary last once it exists (a template change restarts the primary once, after
        its replicas); a primary yet to be created comes first — replicas clone from it."""
        primary = plan.primary
        if primary is None or self.cache.get(STATEFUL_SET, primary, self.namespace) is None:
            return [i for i in plan.instances if i == primary] + [i for i in plan.instances if i != primary]
        return [i for i in plan.instances if i != primary] + [i for i in plan.instances if i == primary]

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
        for instance in self.rollout_order(plan):
            if not await self.ensure_claim(instance):
                continue  # a pod without its volume would only wait
            current = self.cache.get(STATEFUL_SET, instance, self.namespace)
            kept = bootstrap_role(current) if current is not None and is_controlled_by(current, self.cluster) else None
            role = kept or (PRIMARY if instance == plan.primary else REPLICA)
            image = postgres_image(self.spec, major, current, self.images)
            desired = statefulset(self.cluster, self.spec, instance, role=role, image=image, running=self.running,
                                  by_app=statefulset_by_app(current))  # an older one keeps its selector  # fmt: skip
            # An image of another major (a hand edit) is reverted at once: that pod cannot open its data, so waiting
            # for it to become ready first would wait forever.
            wrong_major = current is not None and image_major(current) != major
            if self.restarts_pod(current, desired) and not wrong_major:
                settled = self.settled(plan) if settled is None else settled
                self.primary_behind = self.primary_behind or instance == plan.primary
                if self.rolling is not None or not (settled or self.broken_replica(plan, instance)):
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

    def restarts_pod(self, current: Obj | None, desired: Obj) -> bool:
        """Whether applying ``desired`` would replace a running pod (its template changes while it runs)."""
        if current is None or not self.running or int((current.get("spec") or {}).get("replicas", 0)) == 0:
            return False
        return not is_subset(desired["spec"]["template"], (current.get("spec") or {}).get("template"))

    async def budgets(self, plan: InstancePlan) -> None:
        """Disruption budgets while a primary and replicas run; none otherwise (nor under the old replica name)."""
        unwanted = [names.legacy_replica_pdb(self.name)]
        if wants_budgets(len(plan.instances), not self.running):
            for budget in disruption_budgets(self.cluster, by_app=cluster_routes_by_app(self.cache, self.cluster)):
                await self.apply(POD_DISRUPTION_BUDGET, budget)
        else:
            unwanted += [names.primary_pdb(self.name), names.replica_pdb(self.name)]
        for name in unwanted:
            existing = self.cache.get(POD_DISRUPTION_BUDGET, name, self.namespace)
            if existing is not None and is_controlled_by(existing, self.cluster):
                deleted = self.client.delete(POD_DISRUPTION_BUDGET, name, self.namespace)
                await self.write(POD_DISRUPTION_BUDGET, name, deleted)

    async def storage(self, plan: InstancePlan) -> StoragePlan:
        """Grow every claim to ``spec.storage.size`` when its class allows it; report it when it does not."""
        claims = [c for i in plan.instances if (c := self.cache.get(PVC, i, self.namespace)) is not None]
        classes = {c["metadata"]["name"]: c for c in self.cache.list(STORAGE_CLASS)}
        result = plan_storage(claims, self.spec.storage.size, classes)
        for name, patch in result.grow.items():
            await self.write(PVC, name, self.client.patch(PVC, name, patch, self.namespace))
        if result.grow:
            await self.r.events.normal(self.cluster, "ResizingStorage", f"growing volumes "
                                       f"{', '.join(sorted(result.grow))} to {self.spec.storage.size}")  # fmt: skip
        return result

    def check_storage_class(self, plan: InstancePlan) -> None:
        """A class that does not exist leaves claims Pending forever: name it (the pods only say Pending)."""
        classes = {c["metadata"]["name"] for c in self.cache.list(STORAGE_CLASS)}
        missing: dict[str, list[str]] = {}
        wanted = self.spec.storage.storage_class_name
        if wanted and wanted not in classes:
            missing[wanted] = []
        for instance in plan.instances:
            pvc = self.cache.get(PVC, instance, self.namespace) or {}
            class_name = (pvc.get("spec") or {}).get("storageClassName")
            if class_name and class_name not in classes and (pvc.get("status") or {}).get("phase") != "Bound":
                missing.setdefault(class_name, []).append(instance)
        for class_name, waiting in missing.items():
            self.problems.append(storage_class_missing(class_name, waiting))

    # --- step 5: instances -----------------------------------------------------------------------------------------

    async def observe(self) -> tuple[dict[str, InstanceReport], dict[str, Obj]]:
        """Each existing instance's pod (from the cache) and its instance manager's report (over HTTP)."""
        pods: dict[str, Obj] = {}
        for instance in self.existing_instances():
            pod = self.cache.get(POD, names.pod_name(instance), self.namespace)
            if pod is not None and (belongs(pod, self.name) or runs_instance(self.cache, self.cluster, pod)):
                pods[instance] = pod
        if not self.running:
            return {}, pods
        addresses = {
            instance: ip
            for instance, pod in pods.items()
            if (ip := (pod.get("status") or {}).get("podIP")) and not pod["metadata"].get("deletionTimestamp")
        }
        token = secret_value(self.cache.get(SECRET, names.api_secret(self.name), self.namespace), "token")
        reports = await gather_reports(self.r.instances, addresses, token)  # GET /status needs the API token
        # An address can be reused by another pod: trust a report only from the instance it names.
        return {name: report for name, report in reports.items() if report.name == name}, pods

    async def label_pods(
        self, plan: InstancePlan, reports: dict[str, InstanceReport], pods: dict[str, Obj], fenced: set[str]
    ) -> None:
        """``kanri.dev/role`` on each pod, from the role its instance reports, so the Services route right.

        Before an instance reports, a pod without the label gets its expected role (the primary the plan chose,
        replicas otherwise): replicas clone from ``-rw``, so the bootstrap primary must be behind it first. A label
        is never flipped without a report saying so — except to ``fenced`` for an instance the split-brain record
        keeps fenced (a recreated pod of it must not be routed to before it reports).
        """
        for instance, pod in pods.items():
            labels = pod["metadata"].get("labels") or {}
            report = reports.get(instance)
            if report is not None:
                wanted = report.role
            elif instance in fenced:
                wanted = FENCED
            elif ROLE in labels:
                wanted = labels[ROLE]
            else:
                wanted = PRIMARY if instance == plan.primary else REPLICA
            # with the app labels a pod of a StatefulSet made before them lacks: the Services select by them too
            patch = missing_labels(pod, self.name, owned=True)
            if labels.get(ROLE) != wanted:
                patch[ROLE] = wanted
            if not patch:
                continue
            name = pod["metadata"]["name"]
            try:
                await self.client.patch(POD, name, {"metadata": {"labels": patch}}, self.namespace)
            except ApiError as exc:
                if not exc.not_found:
                    self.rejected(POD, name, exc)

    async def fence_rogues(self, verdict: Verdict, pods: dict[str, Obj]) -> None:
        """Split brain: each primary but the kept one is labelled ``fenced`` (neither ``-rw`` nor ``-ro`` selects
        it), then asked to stop PostgreSQL and keep it stopped. Both are repeated each pass until it reports fenced;
        a refusal is logged (the label holds the routing meanwhile)."""
        for held in verdict.held:
            log.warning("an instance reports primary while the recorded primary does not answer; not routed to it "
                        "until both report", cluster=self.name, namespace=self.namespace, instance=held)  # fmt: skip
        if not verdict.split or verdict.kept is None:
            return
        token = secret_value(self.cache.get(SECRET, names.api_secret(self.name), self.namespace), "token")
        for rogue in verdict.fence:
            log.warning("split brain: fencing a second primary", cluster=self.name, namespace=self.namespace,
                        kept=verdict.kept.describe(), fenced=rogue.describe(), kept_by=verdict.kept_by)  # fmt: skip
            pod = pods.get(rogue.name)
            if pod is None:
                continue
            name = pod["metadata"]["name"]
            labels = pod["metadata"].get("labels") or {}
            if labels.get(ROLE) != FENCED:
                try:
                    await self.client.patch(POD, name, {"metadata": {"labels": {ROLE: FENCED}}}, self.namespace)
                except ApiError as exc:
                    if not exc.not_found:
                        self.rejected(POD, name, exc)
                else:  # label_pods later this pass reads this, not the cache's older copy (no second patch)
                    pods[rogue.name] = {**pod, "metadata": {**pod["metadata"], "labels": {**labels, ROLE: FENCED}}}
            address = (pod.get("status") or {}).get("podIP")
            if token is None or not address:
                continue
            reason = f"split brain: {verdict.kept.name} is the primary; {HELP}"
            if not await self.r.instances.fence(address, token, reason):
                log.warning("fencing refused or unanswered; retried next pass", instance=rogue.name)

    async def restart(self, plan: InstancePlan, reports: dict[str, InstanceReport]) -> str | None:
        """Restart one instance whose parameters need it (replicas first, the primary last)."""
        primary = next((n for n, r in reports.items() if r.role == "primary"), plan.primary)
        pending = frozenset(name for name, r in reports.items() if r.pending_restart)
        cluster_key = (self.namespace, self.name)
        seen = self.r.pending_since.get(cluster_key)
        if seen is None or seen[0] != pending:
            self.r.pending_since[cluster_key] = seen = (pending, self.r.clock())
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

    async def report(self, observation: Observation) -> None:
        old = self.cluster.get("status") or {}
        new = compute_status(old, observation, datetime.now(UTC))
        if self.r.metrics is not None:
            # old first: lastFailover, failover, backup, tls are written by their own steps, not compute_status
            self.r.metrics.observe({**self.cluster, "status": {**old, **new}}, observation.reports)
        patch = status_patch(old, new)
        if patch is None:
            return  # converged: not even a status write (and no problem is new)
        await self.client.patch_status(POSTGRES_CLUSTER, self.name, {"status": patch}, self.namespace)
        ready = condition_flipped(old, new, "Ready")
        if ready is not None and ready["status"] == "True":
            await self.r.events.normal(self.cluster, "ClusterReady", ready["message"])
        elif ready is not None and ready["reason"] != "Hibernated" and old.get("phase") == "Ready":
            await self.r.events.warning(self.cluster, "ClusterNotReady", ready["message"])
        storage = condition_flipped(old, new, "StorageResizing")
        if storage is not None and storage["reason"] == "ExpansionNotSupported":
            await self.r.events.warning(self.cluster, "StorageExpansionNotSupported", storage["message"])
        upgrade = condition_flipped(old, new, "MajorUpgrade")
        if upgrade is not None and observation.upgrade is not None and observation.upgrade.warn:
            await self.r.events.warning(self.cluster, upgrade["reason"], upgrade["message"])
        # One Warning Event per problem when it appears: the old Degraded message lists the ones already told.
        told = get_condition(old.get("conditions") or [], "Degraded") or {}
        told_message = str(told.get("message") or "") if told.get("status") == "True" else ""
        for problem in ordered(observation.problems):
            if problem.message not in told_message:
                await self.r.events.warning(self.cluster, problem.reason, problem.event or problem.message)
