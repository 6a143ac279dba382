"""Physical replication slots on the primary: one per other listed instance, none for instances gone.

A slot is kanri's when its name starts with the cluster's prefix (``orders`` → ``orders_``): instance names are
``<cluster>-<n>``, so every slot the manager creates carries it, and slots made by hand under other names are never
dropped. An active slot is not dropped (PostgreSQL refuses); the next pass tries again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg
import structlog
from psycopg.rows import DictRow

from kanri.instance.conf import slot_name

log = structlog.get_logger("kanri.instance.slots")


@dataclass
class SlotChanges:
    """What one pass did (for logs and tests)."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)


def desired_slots(name: str, instances: tuple[str, ...]) -> set[str]:
    """The slots a primary named ``name`` keeps for the other ``instances``."""
    return {slot_name(i) for i in instances if i != name}


async def reconcile_slots(
    conn: psycopg.AsyncConnection[DictRow], *, cluster: str, name: str, instances: tuple[str, ...]
) -> SlotChanges:
    """Create missing slots, drop kanri's slots for instances no longer listed."""
    prefix = slot_name(cluster) + "_"
    cursor = await conn.execute(
        "SELECT slot_name, active FROM pg_replication_slots WHERE slot_type = 'physical' AND NOT temporary"
    )
    existing = {row["slot_name"]: bool(row["active"]) for row in await cursor.fetchall()}
    wanted = desired_slots(name, instances)
    changes = SlotChanges()
    for slot in sorted(wanted - existing.keys()):
        # not reserved now: WAL is kept from the moment the replica (or its pg_basebackup) first uses the slot
        await conn.execute("SELECT pg_create_physical_replication_slot(%s)", (slot,))
        changes.created.append(slot)
        log.info("replication slot created", slot=slot)
    for slot, active in sorted(existing.items()):
        if slot in wanted or not slot.startswith(prefix):
            continue
        if active:
            changes.busy.append(slot)
            continue
        await conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        changes.dropped.append(slot)
        log.info("replication slot dropped", slot=slot)
    return changes
