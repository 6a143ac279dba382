"""One pass over a live DatabaseInstance whose class and provider are resolved: resume the operation on record,
else observe, then create, adopt, observe only, or send exactly the fields that differ."""

from __future__ import annotations

from kanri import kit
from kanri.cloud.api import OperationRecord
from kanri.cloud.conditions import user_must_fix
from kanri.cloud.connection import secret as connection
from kanri.cloud.context import CloudContext
from kanri.cloud.names import APPROVE_DOWNTIME
from kanri.cloud.providers.base import Observed
from kanri.cloud.sync import diff, operations
from kanri.cloud.sync.operation import started
from kanri.cloud.sync.polling import RESYNC
from kanri.runtime import Result

__all__ = ["converge"]


def _later(c: CloudContext, observed: Observed | None) -> Result:
    state = observed.state if observed is not None else "creating"
    return Result(requeue_after=c.poll.delay(state))


def _ready(c: CloudContext, observed: Observed, connected: bool) -> None:
    if observed.settled and connected:
        c.ledger.condition("Ready", True, "Available", f"{observed.external_id} is available")
    elif observed.settled and c.spec.adopt_external_id:
        c.ledger.condition("Ready", True, "AvailableWithoutSecret", f"{observed.external_id} is available; no "
                           "connection Secret: the master password of an adopted database is not known")  # fmt: skip
    elif observed.settled:
        c.ledger.condition("Ready", False, "NoConnection", "the provider does not report an endpoint yet")
    else:
        # a database being modified or backed up still serves; one being created or deleted does not
        usable = observed.state in ("modifying", "backing-up", "storage-optimization")
        reason = observed.state.title().replace("-", "")
        c.ledger.condition("Ready", usable, reason, f"{observed.external_id} is {observed.state}")


def _ours(c: CloudContext, observed: Observed) -> bool:
    """A database is ours when it carries our uid, was adopted by ID, or status already names it."""
    return (observed.owner_uid == c.uid or c.spec.adopt_external_id == observed.external_id
            or c.ledger.status.get("externalId") == observed.external_id)  # fmt: skip


async def _resume(c: CloudContext, record: OperationRecord) -> tuple[Result | None, Observed | None]:
    """Advance the operation on record: a Result while it goes on or failed, else what the provider reports."""
    verdict, observed = await operations.advance(c, record)
    if verdict.action in ("call", "wait"):
        c.ledger.condition("Synced", False, "OperationInProgress",
                           f"{record.kind} {record.id}: {verdict.message or 'sent to the provider'}")  # fmt: skip
        if record.kind == "Create":  # not Ready before the create ends, even in a state that serves (backing-up)
            state = observed.state if observed is not None else "not visible yet"
            c.ledger.condition("Ready", False, "Creating", f"{record.kind} {record.id}: the database is {state}")
        elif observed is not None:
            _ready(c, observed, bool(c.ledger.status.get("connectionSecret")))
        return Result(requeue_after=operations.delay(c, record, observed)), observed
    if verdict.action == "failed":
        user_must_fix(c.ledger, "OperationFailed", f"{record.kind} {record.id} failed: {verdict.message}")
        return Result(requeue_after=RESYNC), observed
    return None, observed


async def converge(c: CloudContext) -> Result | None:
    record = c.ledger.record("operation", OperationRecord)
    if record is not None and record.kind != "Delete":
        waiting, observed = await _resume(c, record)
        if waiting is not None:
            return waiting
    else:
        observed = await operations.look(c)
    if c.spec.management_policy == "ObserveOnly":
        return _observe_only(c, observed)
    if observed is None:
        if c.spec.adopt_external_id or c.ledger.status.get("externalId"):
            gone = c.external_id
            user_must_fix(c.ledger, "NotFound", f"the provider has no database {gone} (not created again: its data "
                                                "would be new and empty)")  # fmt: skip
            c.ledger.condition("Ready", False, "NotFound", f"the provider has no database {gone}")
            return Result(requeue_after=RESYNC)
        return await operations.start(c, operations.create_record(c))
    if not _ours(c, observed):
        user_must_fix(c.ledger, "NameTaken", f"a database named {observed.external_id} exists that was not created "
                                             "for this object: adopt it with spec.adoptExternalId")  # fmt: skip
        return Result(requeue_after=RESYNC)
    operations.record_observed(c, observed)
    modifying = await _update(c, observed)
    if modifying is not None:
        return modifying
    connected = await connection.write(c, observed)
    _ready(c, observed, connected)
    if observed.settled:
        c.ledger.condition("Synced", True, "Synced", "the database has what the spec asks")
    return _later(c, observed)


def _observe_only(c: CloudContext, observed: Observed | None) -> Result:
    """Read the database into status; never write to the provider."""
    if observed is None:
        c.ledger.condition("Ready", False, "NotFound", f"the provider has no database {c.external_id}")
        c.ledger.condition("Synced", False, "NotFound", "ObserveOnly: nothing is created")
        return Result(requeue_after=RESYNC)
    operations.record_observed(c, observed)
    c.ledger.condition("Ready", observed.settled, "Observed" if observed.settled else "NotAvailable",
                       f"{observed.external_id} is {observed.state} (ObserveOnly)")  # fmt: skip
    c.ledger.condition("Synced", True, "ObserveOnly", "managementPolicy ObserveOnly: the provider is never written")
    return _later(c, observed)


async def _update(c: CloudContext, observed: Observed) -> Result | None:
    """Send the fields that differ (none once converged); changes needing downtime are planned first."""
    provider = c.gateway.provider
    fields = diff.changes(c.desired, observed, provider.size_for(c.desired), provider.name)
    downtime = [field for field in fields if field in provider.capabilities().downtime_fields]
    subject = f"{','.join(downtime)} at generation {c.generation}"
    approved = bool(downtime) and kit.approved(c.ctx.obj, APPROVE_DOWNTIME, subject)
    plan = diff.plan(fields, provider.capabilities(), c.spec.maintenance_window, approved)
    _stage_plan(c, plan, subject, observed)
    last = c.ledger.record("lastOperation", OperationRecord)
    if plan.now and last is not None and last.kind == "Modify" and last.outcome == "Failed" \
            and last.generation == c.generation and set(last.fields) == set(plan.now):  # fmt: skip
        user_must_fix(c.ledger, "ModifyNotApplied", f"{', '.join(plan.now)} not applied: {last.message}")
        return None
    if plan.window:
        external, window = observed.external_id, plan.window
        await c.gateway.call("modify", lambda p: p.modify(external, c.desired, window, immediately=False))
        await c.ctx.events.normal(c.ctx.obj, "ChangePlanned", f"{', '.join(window)} applied in the maintenance "
                                  f"window {c.spec.maintenance_window}")  # fmt: skip
    if not plan.now:
        return None
    record = started("Modify", f"modify-{c.generation}-{'-'.join(plan.now)}", "available", plan.now, c.generation)
    return await operations.start(c, record)


def _stage_plan(c: CloudContext, plan: diff.Plan, subject: str, observed: Observed) -> None:
    planned = sorted({*plan.window, *plan.approval, *observed.pending})  # pending: accepted, waiting for the window
    c.ledger.stage("planned", planned)
    if plan.approval:
        ask = f"annotate {APPROVE_DOWNTIME}='{subject}' to apply now"
        need = f"{', '.join(plan.approval)} need downtime and no maintenanceWindow is set"
        c.ledger.condition("Planned", True, "ApprovalRequired", f"{need}: {ask}")
    elif planned:
        c.ledger.condition("Planned", True, "MaintenanceWindow", f"{', '.join(planned)} wait for the maintenance "
                           f"window {c.spec.maintenance_window or observed.maintenance_window}")  # fmt: skip
    else:
        c.ledger.condition("Planned", False, "NothingPlanned", "no change is waiting")
