"""The cluster's status from what the operator observed: pure, so every reason is unit-tested.

Conditions (``Ready``, ``Progressing``, ``Degraded``, ``StorageResizing``, ``MajorUpgrade``) carry specific reasons:

| condition | status | reasons |
|---|---|---|
| Ready | True | ``InstancesReady`` |
| Ready | False | ``PrimaryNotReady``, ``ReplicasNotReady``, ``PrimaryNotRouted`` (every instance ready, ``-rw`` not
routing to the primary yet: ``cluster/routed.py``), ``Hibernated`` |
| Progressing | True | ``Provisioning``, ``Scaling``, ``ScaleDownWaiting``, ``ResizingStorage``,
``PrimaryUpdateWaiting`` (a switchover to update the primary failed: ``status.primaryUpdate``), ``RollingUpdate``,
``RestartingInstances``, ``WaitingForInstances`` |
| Progressing | False | ``Converged``, ``Hibernated`` |
| Degraded | True | a problem's reason: one of ``kanri.postgres.cluster.problems.SEVERITY`` (most serious first, from
``SplitBrain`` to ``ReadsWithheld``; the tuple is the list, so it is not repeated here), else ``InstanceErrors``,
``ReplicasNotReady`` (the primary serves, a replica does not) |
| Degraded | False | ``AsExpected`` |
| StorageResizing | True | ``Resizing`` (a claim's capacity is below its request) |
| StorageResizing | False | ``Resized``, ``ExpansionNotSupported`` (the class cannot grow volumes: the user must act) |
| MajorUpgrade | False | ``NotRequested``, ``UpgradeNotApproved``, ``UpgradeApproved``, ``DowngradeNotSupported``,
``NoBackupRepository`` |
| FailoverBlocked | True | ``ManualPolicy``, ``DataLossAboveLimit``, ``DataLossUnknown``, ``NoSynchronousStandby``,
``NoCandidate`` (the failover waits for ``kanri.dev/approve-failover``) |
| FailoverBlocked | False | ``NotBlocked`` (present once a failover was blocked) |

Messages name instances, claims, Secrets' keys and parameters, never credentials; an instance's ``lastError`` text
stays out of status (it may quote SQL), only the fact that there is one. An instance's ``problems`` do reach
``Degraded`` (their messages are made for it: ``PostgresUnreachable`` carries libpq's first line, never SQL), even
while the cluster is created: only ``lastError`` of a replica still cloning is left out then.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.cluster.problems import Problem, ordered
from kanri.postgres.ha.primary_update import PLANNED
from kanri.postgres.ha.splitbrain import fenced_names
from kanri.postgres.labels import FENCED
from kanri.postgres.topology.plan import InstancePlan
from kanri.postgres.topology.storage import StoragePlan
from kanri.postgres.upgrade.versions import UpgradeVerdict
from kanri.runtime import get_condition, parse_optional_time, set_condition

__all__ = ["MANAGED_FIELDS", "Observation", "compute_status", "condition_flipped", "status_patch"]

Obj = dict[str, Any]
_MIB = 1 << 20
MANAGED_FIELDS = ("phase", "conditions", "observedGeneration", "currentPrimary", "timeline", "instances",
                  "readyReplicas", "postgresMajor", "systemIdentifier", "splitBrain")  # fmt: skip
"""The status fields this reconciler writes (others, such as ``backup``, belong to other steps)."""


@dataclass(frozen=True)
class Observation:
    """Everything one reconcile saw and did that the status reports."""

    plan: InstancePlan
    hibernated: bool
    generation: int
    reports: Mapping[str, InstanceReport]
    pods: Mapping[str, Obj]
    """Instance name -> its pod, for those that have one."""
    storage: StoragePlan
    scaled: bool = False
    """This pass added or removed instances."""
    restarting: str | None = None
    rolling: str | None = None
    """The instance whose pod template is being updated now (one at a time, replicas first)."""
    waiting_to_roll: tuple[str, ...] = ()
    """Instances whose new pod template waits for the rollout to reach them."""
    problems: tuple[Problem, ...] = ()
    """What the user must fix (Degraded, most serious first)."""
    removal_waiting: Mapping[str, str] = field(default_factory=dict)
    """Replicas the scale-down would remove, each with why it may not be removed yet."""
    major: int | None = None
    """The major the data has (the image runs it)."""
    upgrade: UpgradeVerdict | None = None
    system_identifier: str | None = None
    """The cluster's system identifier, once a primary reported it."""
    split_brain: Obj | None = None
    """``status.splitBrain`` (``splitbrain.next_record``): kept while a fenced instance is unresolved."""
    failover: Obj | None = None
    """``status.failover`` while a failover or switchover runs (``failover_step.py`` writes it itself)."""
    primary_waiting: str | None = None
    """Why the primary's update (rollout or restart) waits: a switchover for this spec failed (``primary_update``)."""
    upgrading: str | None = None
    """A major upgrade under way (``upgrade_step.in_progress``): what it does now."""
    unrouted: str | None = None
    """Why ``-rw`` does not route to the primary yet (:mod:`kanri.postgres.cluster.routed`): Ready waits."""
    lag: Mapping[str, int | None] | None = None
    """Replica -> replay lag as the primary sees it, None when unknown (:mod:`kanri.postgres.ha.reads`); None: each
    replica's own figure."""


def _instance(name: str, obs: Observation, primary: str | None) -> Obj:
    report = obs.reports.get(name)
    if report is not None:
        role = report.role
    elif name in fenced_names(obs.split_brain):
        role = FENCED
    else:
        role = "primary" if name == primary else "replica"
    entry: Obj = {"name": name, "role": role.capitalize(), "ready": bool(report and report.ready)}
    lag = report.lag_bytes if report is not None and obs.lag is None else (obs.lag or {}).get(name)
    if report is not None and report.role == "replica" and lag is not None:
        # Whole MiB only: a replica a few bytes behind a busy primary would otherwise rewrite the status on every
        # pass. WAL positions and the exact lag are metrics (kanri.postgres.metrics), not status. Unknown (the
        # primary does not list the replica): no figure at all, never a stale 0.
        entry["lagBytes"] = lag - lag % _MIB
    return entry


def _why_not_ready(name: str, obs: Observation) -> str:
    pod = obs.pods.get(name)
    report = obs.reports.get(name)
    if report is not None and report.role == FENCED:
        return f"{name}: fenced (PostgreSQL kept stopped)"
    if report is not None and any(p.reason == "PostgresUnreachable" for p in report.problems):
        return f"{name}: PostgreSQL running but its instance manager cannot connect (see Degraded)"
    if report is not None and any(p.reason == "DiskFull" for p in report.problems):  # kanri:disk-full
        return f"{name}: its data volume is full (see Degraded)"
    if report is not None:
        return f"{name}: PostgreSQL not ready" + (" (instance reports an error)" if report.last_error else "")
    if pod is None:
        return f"{name}: no pod yet"
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if phase != "Running":
        return f"{name}: pod {phase}"
    return f"{name}: instance manager not answering"


def _current_primary(obs: Observation) -> str | None:
    reported = [name for name in obs.plan.instances if (r := obs.reports.get(name)) and r.role == "primary"]
    if obs.plan.primary in reported or not reported:
        return obs.plan.primary
    return reported[0]


Verdict = tuple[bool, str, str]
"""A condition's status, reason and message."""


@dataclass(frozen=True)
class _Seen:
    """What every condition of one status is decided from: the instances that should run and which are ready."""

    primary: str | None
    instances: list[str]
    ready: list[str]
    not_ready: list[str]
    never_ready: bool
    """The cluster was never Ready and is not now: it is being created."""
    scaling: bool

    @property
    def primary_ready(self) -> bool:
        return self.primary in self.ready

    @property
    def summary(self) -> str:
        return f"{len(self.ready)}/{len(self.instances)} instances ready"


def _seen(old: Obj, obs: Observation) -> _Seen:
    primary = _current_primary(obs)
    instances = [] if obs.hibernated else obs.plan.instances
    ready = [name for name in instances if (r := obs.reports.get(name)) is not None and r.ready]
    not_ready = [name for name in instances if name not in ready]
    previous_phase = old.get("phase")
    serving = primary in ready and not not_ready and obs.unrouted is None
    never_ready = previous_phase in (None, "Pending", "Provisioning") and not serving
    scaling = obs.scaled or (previous_phase == "Scaling" and bool(not_ready))
    return _Seen(primary, instances, ready, not_ready, never_ready, scaling)


def _ready(obs: Observation, seen: _Seen, details: str) -> Verdict:
    if obs.upgrading and (obs.hibernated or seen.not_ready or not seen.primary_ready):
        return False, "MajorUpgrade", obs.upgrading
    if obs.hibernated:
        kept = ", ".join(obs.plan.instances) or "none"
        return False, "Hibernated", f"replicas is 0: every instance is stopped; volumes kept: {kept}"
    if not seen.not_ready and seen.primary_ready and obs.unrouted:
        return False, "PrimaryNotRouted", f"{seen.summary}: {obs.unrouted}"
    if not seen.not_ready and seen.primary_ready:
        return True, "InstancesReady", f"{seen.summary}, primary {seen.primary}"
    reason = "ReplicasNotReady" if seen.primary_ready else "PrimaryNotReady"
    return False, reason, f"{seen.summary}: {details}" if details else seen.summary


def _progressing(obs: Observation, seen: _Seen) -> Verdict:
    if obs.upgrading:
        return True, "MajorUpgrade", obs.upgrading
    if obs.hibernated:
        return False, "Hibernated", "every instance is stopped"
    if obs.removal_waiting:
        why = "; ".join(f"{name}: {reason}" for name, reason in sorted(obs.removal_waiting.items()))
        return True, "ScaleDownWaiting", (f"a replica is removed only once it reported itself replica behind a "
                                          f"reporting primary; waiting: {why}")  # fmt: skip
    if seen.scaling:
        return True, "Scaling", f"{seen.summary}; instances: {', '.join(seen.instances)}"
    if seen.never_ready:
        return True, "Provisioning", f"creating the cluster: {seen.summary}"
    if obs.storage.resizing:
        return True, "ResizingStorage", f"volumes growing: {', '.join(obs.storage.resizing)}"
    if obs.primary_waiting:
        return True, "PrimaryUpdateWaiting", obs.primary_waiting
    if obs.rolling or obs.waiting_to_roll:
        waiting = f"; next: {', '.join(obs.waiting_to_roll)}" if obs.waiting_to_roll else ""
        doing = f"updating {obs.rolling}" if obs.rolling else "waiting for every instance to be ready"
        return True, "RollingUpdate", f"pod template changed: {doing}{waiting}"
    if obs.restarting:
        return True, "RestartingInstances", f"restarting {obs.restarting} to apply parameters"
    if seen.not_ready:
        return True, "WaitingForInstances", seen.summary
    return False, "Converged", "the cluster matches its spec"


def _degraded(obs: Observation, seen: _Seen, problems: list[Problem], details: str, switching: str | None) -> Verdict:
    # A replica being created (the cluster provisioning or scaling up) whose first clone ran before its primary or
    # slot was there reports that as its lastError; that is the creation still in progress, not a degradation. Nor
    # is a planned switchover's former primary, restarting as a replica.
    creating = seen.never_ready or seen.scaling
    errors = [
        name
        for name in seen.instances
        if (r := obs.reports.get(name)) is not None
        and r.last_error
        and not (creating and r.role == "replica" and not r.ready)
        and name != switching
    ]
    if problems:
        return True, problems[0].reason, "; ".join(p.message for p in problems)
    if errors:
        return True, "InstanceErrors", f"instances report errors: {', '.join(errors)}"
    if switching is not None and set(seen.not_ready) <= {switching}:
        return False, "AsExpected", f"planned switchover: {switching} comes back as a replica"
    if seen.primary_ready and seen.not_ready and not creating:
        return True, "ReplicasNotReady", f"the primary serves; {details}"
    return False, "AsExpected", "no instance reports a problem"


def _storage_resizing(obs: Observation) -> Verdict:
    if obs.storage.blocked:
        return False, "ExpansionNotSupported", (f"StorageClass {obs.storage.blocked_class} does not allow volume "
                                                f"expansion; claims kept at their size: "
                                                f"{', '.join(obs.storage.blocked)}")  # fmt: skip
    if obs.storage.resizing or obs.storage.grow:
        growing = sorted({*obs.storage.resizing, *obs.storage.grow})
        return True, "Resizing", f"volumes growing: {', '.join(growing)}"
    return False, "Resized", "every volume has its requested size"


SWITCHOVER_SETTLE = timedelta(seconds=60)
"""After a planned switchover, how long its former primary may take to serve as a replica before the cluster reads
as Degraded (it restarts as a standby of the new primary: seconds, as a rule)."""


def _switching_over(old: Obj, obs: Observation, now: datetime) -> str | None:
    """The former primary of a planned switchover (issue 29 item 13) that runs, or that finished within
    :data:`SWITCHOVER_SETTLE` while the former primary is not ready again as a replica; None otherwise. A planned
    switchover is no failure: the cluster reads as SwitchingOver, not FailingOver nor Degraded."""
    if obs.failover:
        return str(obs.failover.get("from")) if obs.failover.get("reason") in PLANNED else None
    last = old.get("lastFailover") or {}
    raw = last.get("time")
    when = parse_optional_time(raw) if isinstance(raw, str) else None
    former = last.get("from")
    if last.get("reason") not in PLANNED or when is None or now - when > SWITCHOVER_SETTLE or not former:
        return None
    report = obs.reports.get(str(former))
    return None if report is not None and report.ready and report.role == "replica" else str(former)


def _phase(obs: Observation, seen: _Seen, problems: list[Problem], switching: str | None) -> str:
    if obs.upgrading:
        return "Upgrading"
    if obs.hibernated:
        return "Hibernated"
    if switching is not None and (obs.failover or not problems):
        return "SwitchingOver"
    if obs.failover:
        return "FailingOver"
    if seen.primary_ready and not seen.not_ready and not problems and not obs.removal_waiting and not obs.unrouted:
        return "Ready"
    if seen.scaling or obs.removal_waiting:
        return "Scaling"
    if seen.never_ready:
        return "Provisioning"
    return "Degraded"


def compute_status(old: Obj, obs: Observation, now: datetime) -> Obj:
    """The status the operator should write: the managed fields of ``old`` recomputed (``old`` is not changed)."""
    seen = _seen(old, obs)
    conditions = copy.deepcopy(old.get("conditions") or [])

    def condition(kind: str, verdict: Verdict) -> None:
        status, reason, message = verdict
        set_condition(conditions, type=kind, status=status, reason=reason, message=message,
                      observed_generation=obs.generation, now=now)  # fmt: skip

    details = "; ".join(_why_not_ready(name, obs) for name in seen.not_ready)
    problems = ordered(obs.problems)
    switching = _switching_over(old, obs, now)
    condition("Ready", _ready(obs, seen, details))
    condition("Progressing", _progressing(obs, seen))
    condition("Degraded", _degraded(obs, seen, problems, details, switching))
    condition("StorageResizing", _storage_resizing(obs))
    if obs.upgrade is not None:
        condition("MajorUpgrade", (False, obs.upgrade.reason, obs.upgrade.message))
    failover = obs.failover or {}
    if failover.get("phase") == "Blocked":
        condition("FailoverBlocked", (True, str(failover.get("blockedReason") or "Blocked"),
                                      str(failover.get("message") or "the failover waits for approval")))  # fmt: skip
    elif get_condition(conditions, "FailoverBlocked") is not None:
        condition("FailoverBlocked", (False, "NotBlocked", "no failover waits for approval"))
    primary = seen.primary
    primary_report = obs.reports.get(primary) if primary else None
    return {
        "phase": _phase(obs, seen, problems, switching),
        "conditions": conditions,
        "observedGeneration": obs.generation,
        "currentPrimary": primary,
        "timeline": primary_report.timeline if primary_report and primary_report.timeline else old.get("timeline"),
        "instances": [_instance(name, obs, primary) for name in obs.plan.instances],
        "readyReplicas": len(seen.ready),
        "postgresMajor": obs.major if obs.major is not None else old.get("postgresMajor"),
        "systemIdentifier": obs.system_identifier or old.get("systemIdentifier"),
        "splitBrain": obs.split_brain,
    }


def status_patch(old: Obj, new: Obj) -> Obj | None:
    """The merge patch turning ``old`` into ``new`` on the managed fields, or None when nothing changed."""
    patch = {key: new.get(key) for key in MANAGED_FIELDS if old.get(key) != new.get(key)}
    return patch or None


def condition_flipped(old: Obj, new: Obj, kind: str) -> Obj | None:
    """The new condition of ``kind`` when its status or reason changed since ``old``, else None."""
    before = get_condition(old.get("conditions") or [], kind)
    after = get_condition(new.get("conditions") or [], kind)
    if after is None:
        return None
    if before is None or (before.get("status"), before.get("reason")) != (after.get("status"), after.get("reason")):
        return dict(after)
    return None
