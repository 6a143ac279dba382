"""Deleting a deleted cluster's backups runs as a background job (kanri.postgres.backup.repository_work), never in the
reconcile pass: the pure decision over every state, and the jobs' executor (one per namespace, backoff, memory
keyed by uid and dropped)."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any, cast

import pytest

from kanri.postgres.backup.archiving import BackupSettings
from kanri.postgres.backup.cleanup import BackupCleanup
from kanri.postgres.backup.repository_work import POLL, Job, Memory, RepositoryWork, backoff, next_step
from kanri.postgres.backup.s3 import MAX_PAGES
from kanri.runtime import Cache, Client, EventRecorder, Kind, Result
from tests.hostile_s3 import hostile_s3

Obj = dict[str, Any]

pytestmark = pytest.mark.timeout(30)


def test_nothing_remembered_and_the_namespace_free_starts_a_job() -> None:
    assert next_step(None, None, now=0).action == "start"


def test_a_running_job_is_waited_for_at_the_poll_interval() -> None:
    step = next_step(Memory(job=Job("a", "orders")), None, now=0)
    assert (step.action, step.after) == ("wait", POLL)


def test_an_ended_job_is_claimed_as_done_or_failed() -> None:
    assert next_step(Memory(job=Job("a", "orders", deleted=3)), None, now=0).action == "done"
    assert next_step(Memory(job=Job("a", "orders", error="boom")), None, now=0).action == "failed"


def test_after_a_failure_no_job_starts_before_the_backoff_ends() -> None:
    memory = Memory(failures=2, not_before=10.0)
    step = next_step(memory, None, now=4.0)
    assert (step.action, step.after) == ("wait", 6.0)
    assert next_step(memory, None, now=10.0).action == "start"


def test_another_clusters_job_in_the_namespace_makes_this_one_wait_and_names_it() -> None:
    step = next_step(None, "billing", now=0)
    assert (step.action, step.blocker) == ("wait", "billing")
    # its own job wins over the queue: it is already running
    assert next_step(Memory(job=Job("a", "orders")), "billing", now=0).blocker is None


async def test_jobs_run_outside_the_caller_one_per_namespace() -> None:
    work = RepositoryWork()
    release = asyncio.Event()

    async def slow() -> int:
        await release.wait()
        return 7

    assert work.step("uid-1", "a").action == "start"
    work.start("uid-1", "a", "orders", slow)  # returns at once: the caller is never held
    assert work.step("uid-2", "a").blocker == "orders"  # same namespace: queued
    assert work.step("uid-3", "b").action == "start"  # another namespace: free
    release.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert work.step("uid-1", "a").action == "done"
    assert work.step("uid-2", "a").action == "start"
    assert work.claim("uid-1").deleted == 7
    assert "uid-1" not in work.memory  # a success forgets the cluster


async def test_a_failed_job_counts_towards_the_backoff_and_keeps_its_error() -> None:
    now = [100.0]
    work = RepositoryWork(clock=lambda: now[0])

    async def failing() -> int:
        raise RuntimeError("ListObjectsV2 on bucket b: still truncated after the limit of 1000 pages")

    for attempt in (1, 2):
        work.start("uid-1", "a", "orders", failing)
        await _ended(work, "uid-1")
        job = work.claim("uid-1")
        assert job.error is not None
        assert "limit of 1000 pages" in job.error
        memory = work.memory["uid-1"]
        assert memory.failures == attempt
        assert memory.not_before == now[0] + backoff(attempt)
        now[0] = memory.not_before


async def test_a_job_past_its_deadline_is_cancelled_and_fails() -> None:
    work = RepositoryWork(deadline=0.2)

    async def forever() -> int:
        await asyncio.Event().wait()
        return 0

    work.start("uid-1", "a", "orders", forever)
    await _ended(work, "uid-1")
    assert work.claim("uid-1").error == "not done within the deadline of 0.2s"


async def test_the_memory_of_a_cluster_that_is_gone_is_dropped_and_its_job_stopped() -> None:
    work = RepositoryWork()

    async def forever() -> int:
        await asyncio.Event().wait()
        return 0

    work.start("uid-gone", "a", "orders", forever)
    work.start("uid-kept", "b", "orders", forever)
    task = work.memory["uid-gone"].job
    assert task is not None
    assert task.task is not None
    work.sweep({"uid-kept"})
    assert set(work.memory) == {"uid-kept"}
    await asyncio.sleep(0)
    assert task.task.cancelled()
    await work.aclose()


async def _ended(work: RepositoryWork, uid: str) -> None:
    job = work.memory[uid].job
    assert job is not None
    assert job.task is not None
    await asyncio.wait_for(job.task, 5)


# --- the finalizer step (BackupCleanup) over a real S3 stand-in, with the API at the client boundary faked ----------


class _Api:
    """The cache, client and event recorder in one: the objects the step reads, what it writes."""

    def __init__(self, objects: list[Obj]) -> None:
        self.objects = objects
        self.deleted: list[tuple[str, str]] = []
        self.conditions: list[tuple[str, str]] = []
        self.events: list[str] = []

    def list(self, kind: Kind, namespace: str | None = None, labels: dict[str, str] | None = None) -> list[Obj]:
        wanted = (labels or {}).items()
        return [o for o in self.objects if o["kind"] == kind.kind
                and namespace in (None, o["metadata"].get("namespace"))
                and all((o["metadata"].get("labels") or {}).get(k) == v for k, v in wanted)]  # fmt: skip

    def get(self, kind: Kind, name: str, namespace: str = "") -> Obj | None:
        return next((o for o in self.list(kind, namespace) if o["metadata"]["name"] == name), None)

    async def patch_status(self, kind: Kind, name: str, patch: Obj, namespace: str) -> Obj:
        for condition in patch["status"]["conditions"]:
            self.conditions.append((condition["reason"], condition["message"]))
        return {}

    async def delete(self, kind: Kind, name: str, namespace: str) -> None:
        self.deleted.append((kind.kind, name))

    async def normal(self, obj: Obj, reason: str, message: str) -> None:
        self.events.append(reason)

    async def warning(self, obj: Obj, reason: str, message: str) -> None:
        self.events.append(reason)


class _Client:
    """The writes, at the client boundary (reads of the cluster answer from the same objects)."""

    def __init__(self, api: _Api) -> None:
        self.api = api

    async def get(self, kind: Kind, name: str, namespace: str) -> Obj:
        found = self.api.get(kind, name, namespace)
        assert found is not None
        return found

    async def patch_status(self, kind: Kind, name: str, patch: Obj, namespace: str) -> Obj:
        return await self.api.patch_status(kind, name, patch, namespace)

    async def delete(self, kind: Kind, name: str, namespace: str) -> None:
        await self.api.delete(kind, name, namespace)


def _deleted_cluster(endpoint: str) -> Obj:
    repository = {"s3": {"endpoint": endpoint, "bucket": "backups", "credentialsSecret": {"name": "keys"}}}
    return {"kind": "PostgresCluster", "metadata": {"name": "orders", "namespace": "a", "uid": "uid-orders"},
            "spec": {"version": 15, "replicas": 1, "storage": {"size": "1Gi"}, "deletionPolicy": "Delete",
                     "backup": {"repository": repository}}}  # fmt: skip


def _objects(cluster: Obj) -> list[Obj]:
    keys = {"accessKeyId": base64.b64encode(b"id").decode(), "secretAccessKey": base64.b64encode(b"s").decode()}
    backups = [{"kind": "PostgresBackup", "metadata": {"name": n, "namespace": "a"}, "spec": {"cluster": c}}
               for n, c in (("orders-1", "orders"), ("orders-2", "orders"), ("billing-1", "billing"))]  # fmt: skip
    return [cluster, {"kind": "Secret", "metadata": {"name": "keys", "namespace": "a"}, "data": keys}, *backups]


async def _passes_until_done(cleanup: BackupCleanup, api: _Api, cluster: Obj) -> list[Result | None]:
    """Finalizer passes, as the controller would run them (each returns at once), until the step lets go."""
    results: list[Result | None] = []
    async with asyncio.timeout(10):
        while True:
            started = time.monotonic()
            result = await cleanup.run(cast(Client, _Client(api)), cast(Cache, api), cast(EventRecorder, api), cluster)
            assert time.monotonic() - started < 1.0, "a pass waited on the repository"
            results.append(result)
            if result is None:
                return results
            await asyncio.sleep(0.05)  # stands in for requeue_after


async def test_delete_policy_deletes_the_store_objects_then_the_clusters_postgresbackups_only() -> None:
    async with hostile_s3("empty") as server:
        cluster = _deleted_cluster(server.endpoint)
        api = _Api(_objects(cluster))
        cleanup = BackupCleanup(BackupSettings)
        results = await _passes_until_done(cleanup, api, cluster)
    assert isinstance(results[0], Result)  # the first pass only started the job
    assert api.conditions[0][0] == "Deleting"
    assert sorted(api.deleted) == [("PostgresBackup", "orders-1"), ("PostgresBackup", "orders-2")]
    assert "BackupsDeleted" in api.events
    assert cleanup.work.memory == {}  # forgotten once done
    assert [m for m, _ in server.requests] == ["GET", "GET"]  # the two listings; nothing to delete


async def test_a_store_that_pages_forever_fails_the_job_and_the_condition_names_the_limit() -> None:
    async with hostile_s3("pages") as server:
        cluster = _deleted_cluster(server.endpoint)
        api = _Api(_objects(cluster))
        cleanup = BackupCleanup(BackupSettings)
        async with asyncio.timeout(20):
            while not any(reason == "DeleteFailing" for reason, _ in api.conditions):
                result = await cleanup.run(
                    cast(Client, _Client(api)), cast(Cache, api), cast(EventRecorder, api), cluster
                )
                assert isinstance(result, Result)
                await asyncio.sleep(0.05)
    reason, message = api.conditions[-1]
    assert reason == "DeleteFailing"
    assert f"limit of {MAX_PAGES} pages" in message
    assert "attempt 1, next in 2s" in message
    assert len(server.requests) == MAX_PAGES
    assert api.deleted == []  # the records stay while the backups are not known to be gone


async def test_an_endpoint_outside_the_allow_list_is_never_called_and_the_finalizer_lets_go() -> None:
    async with hostile_s3("pages") as server:
        cluster = _deleted_cluster(server.endpoint)
        api = _Api(_objects(cluster))
        cleanup = BackupCleanup(lambda: BackupSettings(allowed_endpoints=("minio.storage:9000",)))
        assert (
            await cleanup.run(cast(Client, _Client(api)), cast(Cache, api), cast(EventRecorder, api), cluster) is None
        )
    assert api.events == ["BackupsNotDeleted"]
    assert server.requests == []
