"""The ConfigMap every instance manager reads: PostgreSQL parameters, the instance list, synchronous standbys, and
``systemIdentifier`` once a primary has reported it — from then on an instance with an empty volume never runs
initdb (it clones from the primary, or reports ``DataDirectoryLost``). Before that the key is absent.

Instances watch the mounted file and reload PostgreSQL themselves; a parameter that needs a restart shows up as
``pendingRestart`` in their status, and the operator restarts them one at a time (see ``restarts.py``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kanri.contract.instance_config import ArchiveTarget, ClusterConfig, RecoveryPlan, UpgradeNote
from kanri.postgres import names
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.children import child_meta, owned
from kanri.postgres.labels import cluster_labels

__all__ = ["CONFIG_KEY", "config_map", "instance_config", "synchronous_standbys"]

Obj = dict[str, Any]
CONFIG_KEY = "instance.json"


def synchronous_standbys(spec: PostgresClusterSpec) -> int:
    """How many replicas must confirm each commit: 0 with mode Async, ``syncStandbys`` (default 1) with Sync."""
    if spec.replication.mode != "Sync":
        return 0
    return spec.replication.sync_standbys or 1


def instance_config(
    spec: PostgresClusterSpec,
    instances: list[str],
    system_identifier: str | None = None,
    archive: Obj | None = None,
    recovery: Obj | None = None,
    upgrade: Obj | None = None,
    synchronous: int | None = None,
) -> str:
    """The JSON document at ``/etc/kanri/config/instance.json`` (keys sorted: same input, same bytes); ``archive``
    is where WAL goes (:func:`kanri.postgres.backup.archiving.archive_target`), absent without a repository;
    ``recovery`` the
    backups a new cluster restores (:func:`kanri.postgres.recovery.bootstrap.entry`), absent once restored or with
    initdb. ``synchronous``: how many synchronous standbys now (``dataDurability: preferred`` may lower it:
    :mod:`kanri.postgres.ha.durability`); None: the spec's number."""
    parameters = dict(spec.postgresql.parameters) if spec.postgresql else {}
    # constructed, not validated: the entries come already built by their own contract types (archiving's
    # ArchiveTarget, bootstrap's RecoveryPlan, the upgrade's UpgradeNote); what the instance would refuse is refused
    # there, as before, not raised here
    config = ClusterConfig.model_construct(
        parameters=parameters,
        instances=tuple(instances),
        synchronous_standbys=synchronous_standbys(spec) if synchronous is None else synchronous,
        system_identifier=system_identifier,
        archive=None if archive is None else ArchiveTarget.model_construct(**archive),
        recovery=None if recovery is None else _recovery_plan(recovery),
        upgrade=None if upgrade is None else UpgradeNote.model_construct(**upgrade),
    )
    return config.render()


def _recovery_plan(entry: Obj) -> RecoveryPlan:
    """:func:`kanri.postgres.recovery.bootstrap.entry`'s dict as the contract's type again (its time parsed back:
    ``datetime.isoformat`` and ``fromisoformat`` round-trip exactly, so the bytes stay the same)."""
    fields = dict(entry)
    fields["source"] = ArchiveTarget.model_construct(**entry["source"])
    if isinstance(when := entry.get("targetTime"), str):
        fields["targetTime"] = datetime.fromisoformat(when)
    return RecoveryPlan.model_construct(**fields)


def config_map(
    cluster: Obj,
    spec: PostgresClusterSpec,
    instances: list[str],
    system_identifier: str | None = None,
    archive: Obj | None = None,
    recovery: Obj | None = None,
    *,
    upgrade: Obj | None = None,
    synchronous: int | None = None,
) -> Obj:
    name = cluster["metadata"]["name"]
    meta = child_meta(cluster, names.config_map(name), cluster_labels(name))
    document = instance_config(spec, instances, system_identifier, archive, recovery, upgrade, synchronous)
    return owned("v1", "ConfigMap", meta, data={CONFIG_KEY: document})
