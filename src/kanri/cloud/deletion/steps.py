"""Deleting a DatabaseInstance: deletionPolicy Retain lets the database go (it keeps running; the connection Secret
stays for whoever takes it over), Delete deletes it after its final snapshot (the Delete operation is on record
before the call, so a restart waits for the same deletion). ObserveOnly never deletes."""

from __future__ import annotations

from kanri import kit
from kanri.cloud.api import OperationRecord
from kanri.cloud.context import CloudContext
from kanri.cloud.names import LABELS
from kanri.cloud.sync import operations
from kanri.runtime import Result
from kanri.runtime.kinds import SECRET

__all__ = ["delete", "retain"]


async def retain(c: kit.ObjectPass, release: CloudContext | None, *, why: str) -> None:
    """Let the database go and keep the connection Secret; say so in an Event."""
    external = c.ledger.status.get("externalId")
    if release is not None and external:
        await release.gateway.provider.release(external)
    data = kit.data_of(c.cache, [SECRET], LABELS, c.obj)
    await kit.carry_out("Retain", c.client, c.events, c.obj, data)
    what = f"the database {external} keeps running, no longer managed" if external else "no database was created"
    await c.events.normal(c.obj, "DatabaseRetained", f"{why}: {what}")


async def delete(c: CloudContext) -> Result | None:
    """Delete the database (final snapshot first unless finalSnapshot is false); None once it is gone."""
    record = c.ledger.record("operation", OperationRecord)
    if record is None or record.kind != "Delete":
        if await operations.look(c) is None:
            await _gone(c, None)  # never created, or gone already: nothing to snapshot
            return None
        record = operations.delete_record(c)
        await c.ledger.commit("operation", record)
    verdict, observed = await operations.advance(c, record)
    if verdict.action == "succeeded":
        await _gone(c, record)
        return None
    if verdict.action == "failed":
        c.ledger.condition("Synced", False, "DeleteFailed", f"deleting failed: {verdict.message}")
        return Result(requeue_after=300)
    state = observed.state if observed is not None else "deleting"
    c.ledger.condition("Ready", False, "Deleting", f"{c.external_id or c.desired.identifier} is {state}")
    return Result(requeue_after=operations.delay(c, record, observed))


async def _gone(c: CloudContext, record: OperationRecord | None) -> None:
    snapshot = f" after its final snapshot {record.id}" if record is not None and c.spec.final_snapshot else ""
    data = kit.data_of(c.ctx.cache, [SECRET], LABELS, c.ctx.obj)
    await kit.carry_out("Delete", c.ctx.client, c.ctx.events, c.ctx.obj, data)
    await c.ctx.events.normal(c.ctx.obj, "DatabaseDeleted",
                              f"deletionPolicy Delete: the database was deleted{snapshot}")  # fmt: skip
