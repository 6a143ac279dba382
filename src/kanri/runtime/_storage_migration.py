"""Storage version migration: after a CRD's storage version changed, rewrite every object in it, then prune
``status.storedVersions``.

The API server stores each custom object in the version that was the storage version when the object was last
written, and never rewrites it by itself; ``status.storedVersions`` lists every version that may still be in etcd,
and an old version cannot be removed from the CRD while it is listed there (KEP-2330). The migration is what
kube-storage-version-migrator does, in the operator: list every object (in pages, in the storage version, so the
conversion webhook converts the old ones), write each back unchanged with a PUT guarded by the resourceVersion
just read (the API server re-encodes it in the storage version; a conflict or a deletion means somebody else wrote
it already), at a rate limit that keeps the API server and the webhook unhurried; then set storedVersions to the
storage version alone, guarded by the CRD's resourceVersion so a storage version changed meanwhile starts a new
migration instead.

Restarts are safe: a migration that was interrupted lists again from the start (an object already in the storage
version is written again as a no-op, which the API server skips without a write to etcd), and an expired continue
token (410 after etcd compaction) restarts the list the same way. Nothing is kept between runs but the CRD's own
status, so the migration is idempotent: a CRD whose storedVersions already is the storage version is left alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlencode

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from kanri.runtime._client import Client
from kanri.runtime._clock import Clock, SystemClock
from kanri.runtime._errors import ApiError
from kanri.runtime._events import EventRecorder
from kanri.runtime._kinds import CRD, Kind

__all__ = ["MigrationResult", "StorageMigration", "StorageMigrationMetrics"]

log = structlog.get_logger("kanri.storage_migration")
Obj = dict[str, Any]
Outcome = Literal["migrated", "current", "gone", "conflict"]
_ATTEMPTS = 5  # per object, for transient errors


class StorageMigrationMetrics:
    """``kanri_storage_migration_objects_total{crd,result}`` (objects written back: migrated; current, already in
    the storage version so the API server wrote nothing; gone; conflict, written by someone else meanwhile) and
    ``kanri_storage_migration_stored_versions{crd}`` (how many versions storedVersions lists: 1 once migrated)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.objects = Counter(
            "kanri_storage_migration_objects_total",
            "Objects the storage migration wrote back in the storage version, by result",
            ["crd", "result"],
            registry=registry,
        )
        self.stored_versions = Gauge(
            "kanri_storage_migration_stored_versions",
            "Versions the CRD's status.storedVersions lists (1 once every object is in the storage version)",
            ["crd"],
            registry=registry,
        )


@dataclass(frozen=True)
class MigrationResult:
    """What one migration did: the storage version, the storedVersions before, and objects by outcome."""

    crd: str
    storage_version: str
    stored_before: tuple[str, ...]
    migrated: int = 0
    current: int = 0
    gone: int = 0
    conflicts: int = 0

    @property
    def needed(self) -> bool:
        return self.stored_before != (self.storage_version,)


class _Pacer:
    """At most ``rate`` writes a second, evenly spaced (a burst would land on the webhook all at once)."""

    def __init__(self, rate: float, clock: Clock) -> None:
        self.interval = 1.0 / rate
        self.clock = clock
        self.next = clock.now()

    async def wait(self) -> None:
        now = self.clock.now()
        if self.next > now:
            await self.clock.sleep(self.next - now)
        self.next = max(now, self.next) + self.interval


class StorageMigration:
    """Migrates the objects of the CRD ``crd_name`` to its storage version and prunes ``status.storedVersions``.

    ``rate`` is writes per second; ``ready`` (e.g. the conversion webhook's ``ready``) must be True before the first
    read, since reading objects stored in an old version needs conversion. ``events`` records a ``StorageMigrated``
    Event on the CRD. The operator needs ``list``/``update`` on the kind and ``get``/``patch`` on
    ``customresourcedefinitions`` and ``customresourcedefinitions/status``.
    """

    def __init__(
        self,
        client: Client,
        crd_name: str,
        *,
        registry: CollectorRegistry | None = None,
        metrics: StorageMigrationMetrics | None = None,
        events: EventRecorder | None = None,
        rate: float = 20.0,
        page_size: int = 100,
        ready: Callable[[], bool] | None = None,
        retry_interval: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, not {rate}")
        self.client = client
        self.crd_name = crd_name
        self.metrics = metrics or StorageMigrationMetrics(registry if registry is not None else CollectorRegistry())
        self.events = events
        self.rate = rate
        self.page_size = page_size
        self.ready = ready
        self.retry_interval = retry_interval
        self.clock = clock or SystemClock()

    async def run(self) -> None:
        """Migrate until it succeeded once (retrying failures every ``retry_interval``), then return: what
        ``Manager.add_runnable`` takes (leader only: two replicas migrating would only double the writes)."""
        while True:
            if self.ready is not None and not self.ready():
                await self.clock.sleep(1.0)
                continue
            try:
                await self.migrate()
                return
            except (ApiError, OSError, TimeoutError) as error:
                log.warning("storage migration failed; retrying", crd=self.crd_name, error=str(error))
                await self.clock.sleep(self.retry_interval)

    async def migrate(self) -> MigrationResult:
        """One migration: nothing when storedVersions is already the storage version alone; else rewrite every
        object and prune. A CRD whose storage version changed meanwhile is migrated again to the new one."""
        while True:
            crd = await self.client.get(CRD, self.crd_name)
            kind, stored = self._storage_kind(crd), tuple(crd.get("status", {}).get("storedVersions") or ())
            self.metrics.stored_versions.labels(self.crd_name).set(len(stored))
            result = MigrationResult(self.crd_name, kind.api_version.rpartition("/")[2], stored)
            if not result.needed:
                return result
            log.info("storage migration started", crd=self.crd_name, stored=list(stored), to=result.storage_version)
            started = time.monotonic()
            counts = await self._rewrite_all(kind)
            result = MigrationResult(result.crd, result.storage_version, stored, *counts)
            if await self._prune(result):
                await self._report(crd, result, time.monotonic() - started)
                return result
            log.info("storage version changed during the migration; migrating again", crd=self.crd_name)

    def _storage_kind(self, crd: Obj) -> Kind:
        spec = crd["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("storage"))
        names = spec["names"]
        return Kind(f"{spec['group']}/{version}", names["kind"], names["plural"], namespaced=spec["scope"] != "Cluster")

    async def _rewrite_all(self, kind: Kind) -> tuple[int, int, int, int]:
        """Every object written back once; a list whose continue token expired starts again from the top."""
        pacer = _Pacer(self.rate, self.clock)
        counts = {"migrated": 0, "current": 0, "gone": 0, "conflict": 0}
        query: dict[str, str] = {"limit": str(self.page_size)}
        while True:
            try:
                page = await self.client.get_path(f"{kind.path(None)}?{urlencode(query)}")
            except ApiError as error:
                if not error.gone or "continue" not in query:
                    raise
                log.info("continue token expired; listing again from the start", crd=self.crd_name)
                query.pop("continue")
                continue
            for item in page.get("items", []):
                await pacer.wait()
                outcome = await self._rewrite(kind, item)
                counts[outcome] += 1
                self.metrics.objects.labels(self.crd_name, outcome).inc()
            token = page.get("metadata", {}).get("continue")
            if not token:
                return counts["migrated"], counts["current"], counts["gone"], counts["conflict"]
            query["continue"] = token

    async def _rewrite(self, kind: Kind, obj: Obj) -> Outcome:
        """A PUT of the object as read: the API server stores it in the storage version (a no-op if it is)."""
        obj.setdefault("apiVersion", kind.api_version)
        obj.setdefault("kind", kind.kind)
        for attempt in range(_ATTEMPTS):
            try:
                written = await self.client.replace(kind, obj)
                break
            except ApiError as error:
                if error.not_found:
                    return "gone"  # deleted since the list: nothing left to migrate
                if error.conflict:
                    return "conflict"  # written since the list (or by our own earlier attempt): stored anew
                # A 503 while the API server swaps the kind's storage after a CRD update (kubernetes#77752); the
                # resourceVersion guard makes the retry safe.
                if not error.transient or attempt + 1 == _ATTEMPTS:
                    raise
                await self.clock.sleep(0.5 * (attempt + 1))
        # The API server skips a write that would store the same bytes: the object was in the storage version.
        unchanged = written.get("metadata", {}).get("resourceVersion") == obj["metadata"].get("resourceVersion")
        return "current" if unchanged else "migrated"

    async def _prune(self, result: MigrationResult) -> bool:
        """storedVersions := [storage version], only if the CRD still has that storage version (resourceVersion)."""
        crd = await self.client.get(CRD, self.crd_name)
        if self._storage_kind(crd).api_version.rpartition("/")[2] != result.storage_version:
            return False
        patch = {"metadata": {"resourceVersion": crd["metadata"]["resourceVersion"]},
                 "status": {"storedVersions": [result.storage_version]}}  # fmt: skip
        try:
            await self.client.patch(CRD, self.crd_name, patch, subresource="status")
        except ApiError as error:
            if error.conflict:
                return False  # the CRD changed since we read it: look again
            raise
        self.metrics.stored_versions.labels(self.crd_name).set(1)
        return True

    async def _report(self, crd: Obj, result: MigrationResult, seconds: float) -> None:
        message = (f"storage migration to {result.storage_version} done in {seconds:.0f} s: {result.migrated} "
                   f"object(s) rewritten, {result.current} already current, {result.gone} gone, {result.conflicts} "
                   f"written meanwhile; storedVersions was {', '.join(result.stored_before)}")  # fmt: skip
        log.info("storage migration done", crd=self.crd_name, migrated=result.migrated, seconds=round(seconds, 1))
        if self.events is not None:
            await self.events.event(crd, "Normal", "StorageMigrated", message)
