"""Starting and advancing provider operations (the executor of kanri.cloud.sync.operation's decisions)."""

from __future__ import annotations

from datetime import UTC, datetime

from kanri.cloud import naming
from kanri.cloud.api import OperationRecord
from kanri.cloud.connection import secret as connection
from kanri.cloud.context import CloudContext
from kanri.cloud.providers.base import Observed
from kanri.cloud.sync import diff
from kanri.cloud.sync.operation import Verdict, decide, ended, started
from kanri.cloud.sync.polling import poll_delay
from kanri.runtime import Result

__all__ = ["advance", "call", "create_record", "delay", "delete_record", "look", "record_observed", "start"]


async def look(c: CloudContext) -> Observed | None:
    """The database as the provider reports it: by its known ID, else by the name a create gives it."""
    external = c.external_id
    if external:
        return await c.gateway.call("describe", lambda p: p.describe(external))
    return await c.gateway.call("find", lambda p: p.find(c.desired))


def record_observed(c: CloudContext, observed: Observed) -> None:
    """Stage what the provider reports into status."""
    c.ledger.stage("externalId", observed.external_id)
    c.ledger.stage("state", observed.state)
    c.ledger.stage("engineVersion", observed.engine_version)
    if observed.host and observed.port:
        c.ledger.stage("endpoint", {"host": observed.host, "port": observed.port})


async def call(c: CloudContext, record: OperationRecord) -> None:
    """Make the record's provider call (the record is committed already)."""
    if record.kind == "Create":
        password = await connection.ensure_password(c)
        await c.gateway.call("create", lambda p: p.create(c.desired, record.id, password))
    elif record.kind == "Modify":
        external = c.external_id or c.desired.identifier
        fields = tuple(record.fields)
        await c.gateway.call("modify", lambda p: p.modify(external, c.desired, fields, immediately=True))
    else:
        external = c.external_id or c.desired.identifier
        snapshot = record.id if c.spec.final_snapshot else None
        await c.gateway.call("delete", lambda p: p.delete(external, snapshot))
    accepted = record.model_copy(update={"outcome": "InProgress"})
    await c.ledger.commit("operation", accepted)
    c.metrics.operation(c.uid, c.gateway.provider.name, record.kind)


async def start(c: CloudContext, record: OperationRecord) -> Result:
    """Commit the intent, then make the call; a restart between the two finds the record and decides again."""
    await c.ledger.commit("operation", record)
    c.metrics.operation(c.uid, c.gateway.provider.name, record.kind)
    await call(c, record)
    c.ledger.condition("Synced", False, "OperationInProgress", f"{record.kind} {record.id} accepted by the provider")
    return Result(requeue_after=poll_delay("creating", 0) * c.poll.scale)


def create_record(c: CloudContext) -> OperationRecord:
    return started("Create", f"create-{c.uid}", "available", generation=c.generation)


def delete_record(c: CloudContext) -> OperationRecord:
    snapshot = naming.final_snapshot_id(c.external_id or c.desired.identifier, c.uid)
    return started("Delete", snapshot, "deleted", generation=c.generation)


_IN_FLIGHT = {"Create": "creating", "Modify": "modifying", "Delete": "deleting"}


def delay(c: CloudContext, record: OperationRecord, observed: Observed | None) -> float:
    """When to look again at an operation in flight: by the state seen, where "available" (not changed yet, or the
    change not visible yet) counts as the operation's own state, never as settled (which waits for the resync)."""
    state = observed.state if observed is not None and observed.state != "available" else _IN_FLIGHT[record.kind]
    return c.poll.delay(state)


async def advance(c: CloudContext, record: OperationRecord) -> tuple[Verdict, Observed | None]:
    """Poll the operation in ``status.operation`` and act on the verdict; the verdict and what was seen."""
    observed = await look(c)
    converged = True
    if observed is not None and record.kind == "Modify":
        still = diff.changes(c.desired, observed, c.gateway.provider.size_for(c.desired), c.gateway.provider.name)
        converged = not set(still) & set(record.fields)
    verdict = decide(record, observed, converged=converged, now=datetime.now(UTC))
    if observed is not None:
        record_observed(c, observed)
    if verdict.action == "call":
        await call(c, record)
    elif verdict.action == "succeeded" and record.kind == "Delete":
        c.metrics.operation(c.uid, c.gateway.provider.name, None)  # no status write: the object goes next
    elif verdict.action in ("succeeded", "failed"):
        c.ledger.stage("lastOperation", ended(record, verdict))
        # cleared now, not staged: the same pass may start the next operation, whose committed record a staged
        # None would wipe at the pass's status write
        await c.ledger.commit("operation", None)
        c.metrics.operation(c.uid, c.gateway.provider.name, None)
    return verdict, observed
