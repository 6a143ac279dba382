"""Retention sees the repository, not only the PostgresBackup objects (issue 29 item 5): real PostgreSQL 15 in a
local-node pod, real Barman Cloud, SeaweedFS as the store, the operator's real Manager.

The first backup's PostgresBackup is deleted (its backup stays in the store, as after any such deletion); a second
backup is taken on demand; then the operator's clock moves two days on (as in ``test_base_backup_e2e``) and a third
backup is asked (the jump also makes the default schedule's slot due, which adds one). Retention then counts the
backup without an object with the recorded ones: both older ones are outside the 1-day window and go from the store —
the one with no PostgresBackup too, named so in the Event — and the newest stays.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from kanri.local.seaweedfs import backup_tools_bin
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import EVENT
from tests.e2e.postgres_helpers import cluster, ready
from tests.e2e.test_backup_archiving_e2e import (  # noqa: F401  (node, store: the fixtures)
    Store,
    node,
    store,
)
from tests.e2e.test_base_backup_e2e import Clock, base_ids, clocked, phase_is  # noqa: F401  (clocked: a fixture)
from tests.postgres_support import Operator
from tests.support import NotYet, eventually, exists

Obj = dict[str, Any]
NAME = "ret"
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not (backup_tools_bin() / "barman-cloud-backup").exists() or not (backup_tools_bin() / "weed").exists(),
        reason="no backup tools (make backup-tools)",
    ),
]


def backup(name: str, namespace: str) -> Obj:
    return {"apiVersion": POSTGRES_BACKUP.api_version, "kind": "PostgresBackup",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"cluster": NAME}}  # fmt: skip


async def gone(client: Client, namespace: str, name: str) -> bool:
    return not await exists(client, POSTGRES_BACKUP, name, namespace)


async def test_retention_expires_a_backup_whose_postgresbackup_was_deleted_once_outside_the_window(
    client: Client,
    store: Store,  # noqa: F811
    clocked: tuple[Operator, Clock],  # noqa: F811
    namespace: str,
) -> None:
    operator, clock = clocked
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 1, backup={"retentionDays": 1}))
    prefix = f"e2e/{namespace}/{NAME}/"
    async with operator.running(refresh=2.0):
        await eventually(lambda: ready(client, namespace, NAME, 1), timeout=240, interval=1)
        first = await eventually(lambda: phase_is(client, namespace, f"{NAME}-initial", "Completed"), timeout=240,
                                 interval=1)  # fmt: skip
        unrecorded = str(first["backupId"])
        await client.delete(POSTGRES_BACKUP, f"{NAME}-initial", namespace)
        await eventually(lambda: gone(client, namespace, f"{NAME}-initial"), timeout=30, interval=0.5)
        assert unrecorded in await base_ids(store, prefix)  # the object went, its backup stayed

        await client.create(POSTGRES_BACKUP, backup(f"{NAME}-second", namespace))
        second = await eventually(lambda: phase_is(client, namespace, f"{NAME}-second", "Completed"), timeout=240,
                                  interval=1)  # fmt: skip

        clock.offset = timedelta(days=2)  # both backups leave the 1-day window
        await client.create(POSTGRES_BACKUP, backup(f"{NAME}-third", namespace))
        third = await eventually(lambda: phase_is(client, namespace, f"{NAME}-third", "Completed"), timeout=240,
                                 interval=1)  # fmt: skip

        async def only_the_newest() -> set[str] | None:
            # (the clock's jump also makes the default schedule's slot due: its backup may be the newest by then)
            left = await base_ids(store, prefix)
            return left if left and not left & {unrecorded, second["backupId"]} else None

        try:
            await eventually(only_the_newest, timeout=120, interval=1)
        except NotYet as exc:
            others = f"unrecorded {unrecorded}, second {second['backupId']}"
            raise AssertionError(
                f"the store still holds an older backup (newest {third['backupId']}; {others}): {exc}"
            ) from None
        # told in BackupsExpired Events, the unrecorded one named so: one Event, or two — the second backup's own
        # retention runs after its Completed status is written (and the WAL switch), so on a loaded machine it can
        # run after the clock moved: it expires the unrecorded one and keeps the second as the window's base, which
        # the third's run then expires (seen in a CI replica). The Events and the object's deletion follow the store.
        expired: list[str] = []

        async def told() -> bool:
            events, _ = await client.list(EVENT, namespace)
            expired[:] = [str(e.get("message")) for e in events if e.get("reason") == "BackupsExpired"]
            named = any(f"{unrecorded} (no PostgresBackup)" in m for m in expired)
            return (
                named
                and any(f"{NAME}-second" in m for m in expired)
                and await gone(client, namespace, f"{NAME}-second")
            )

        try:
            await eventually(told, timeout=60, interval=1)
        except NotYet:
            raise AssertionError(f"BackupsExpired Events {expired}; {NAME}-second gone: "
                                 f"{await gone(client, namespace, f'{NAME}-second')}") from None  # fmt: skip
