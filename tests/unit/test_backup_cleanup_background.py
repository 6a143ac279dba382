"""Deleting a deleted cluster's backups runs as a background job (kanri.postgres.repository_work), never in the
reconcile pass: the pure decision over every state, and the jobs' executor (one per namespace, backoff, memory
keyed by uid and dropped)."""

from __future__ import annotations

import asyncio

import pytest

from kanri.postgres.repository_work import POLL, Job, Memory, RepositoryWork, backoff, next_step

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
