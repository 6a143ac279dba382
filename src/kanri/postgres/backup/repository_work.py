"""Long repository work (listing and deleting a deleted cluster's backups) outside the shared reconcile workers.

A repository may be a tenant's own server, slow or hostile (issue 33: one answering "more" to every listing pinned
all four reconcile workers and another tenant's new cluster waited 100 s for a status). So the finalizer pass never
waits on it: it starts a job here (idempotent: one per cluster, keyed by the cluster's uid), asks to look again, and
picks the outcome up on a later pass. At most one job runs per namespace, so one tenant's store holds up only that
tenant's deletions; each job has a deadline on top of the S3 client's own limits (:mod:`kanri.postgres.backup.s3`).

The memory kept between passes (the job, the failures in a row for the backoff) is keyed by the cluster's uid and
dropped when the outcome is claimed or the cluster is gone (:meth:`RepositoryWork.sweep`). Losing it (an operator
restart) costs one early retry; nothing else depends on it, since deleting is idempotent.

:func:`next_step` is the pure decision; :class:`RepositoryWork` the thin executor owning the tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

__all__ = ["JOB_DEADLINE", "Job", "Memory", "RepositoryWork", "Step", "backoff", "next_step"]

log = structlog.get_logger("kanri.postgres.backup.repository_work")
JOB_DEADLINE = 900.0
"""Seconds one job (list + delete) may take before it is cancelled and counted as a failure."""


def backoff(failures: int, base: float = 2.0, limit: float = 300.0) -> float:
    """Seconds before the next try after ``failures`` failed ones in a row."""
    return float(min(limit, base * 2 ** max(0, failures - 1)))


@dataclass
class Job:
    """One cluster's job: its task, and the outcome once it ended (objects deleted, or the error's message)."""

    namespace: str
    cluster: str
    task: asyncio.Task[None] | None = None
    deleted: int | None = None
    error: str | None = None

    @property
    def running(self) -> bool:
        return self.deleted is None and self.error is None


@dataclass
class Memory:
    """What is remembered of one cluster between passes (keyed by its uid)."""

    job: Job | None = None
    failures: int = 0
    """Failed jobs in a row."""
    not_before: float = 0.0
    """Monotonic time before which no new job starts (the backoff)."""
    last_error: str | None = None


@dataclass(frozen=True)
class Step:
    """What the finalizer pass does now: ``start`` a job, ``wait`` (one runs, for this cluster or — ``blocker`` —
    another of the namespace; or the backoff), ``done`` (claim the outcome) or ``failed`` (claim the error)."""

    action: Literal["start", "wait", "done", "failed"]
    after: float = 0.0
    """For ``wait``: seconds until it is worth looking again."""
    blocker: str | None = None


POLL = 2.0
"""How often a pass looks at a running job (cheap: memory only, and the condition is written only when it changes)."""


def next_step(memory: Memory | None, busy_with: str | None, now: float) -> Step:
    """The decision for one pass; ``busy_with`` names another cluster of the namespace whose job runs (None: none)."""
    job = memory.job if memory is not None else None
    if job is not None:
        if job.running:
            return Step("wait", POLL)
        return Step("done") if job.error is None else Step("failed")
    if memory is not None and now < memory.not_before:
        return Step("wait", memory.not_before - now)
    if busy_with is not None:
        return Step("wait", POLL, blocker=busy_with)
    return Step("start")


@dataclass
class RepositoryWork:
    """The jobs of every cluster being deleted, and their memory (see the module docstring)."""

    clock: Callable[[], float] = time.monotonic
    deadline: float = JOB_DEADLINE
    memory: dict[str, Memory] = field(default_factory=dict)

    def busy_with(self, namespace: str, uid: str) -> str | None:
        """The cluster of ``namespace`` (other than ``uid``'s) whose job runs, if any."""
        for other, memory in self.memory.items():
            job = memory.job
            if other != uid and job is not None and job.running and job.namespace == namespace:
                return job.cluster
        return None

    def step(self, uid: str, namespace: str) -> Step:
        return next_step(self.memory.get(uid), self.busy_with(namespace, uid), self.clock())

    def start(self, uid: str, namespace: str, cluster: str, work: Callable[[], Coroutine[Any, Any, int]]) -> None:
        """Run ``work`` (returns how many objects it deleted) as this cluster's job."""
        memory = self.memory.setdefault(uid, Memory())
        job = memory.job = Job(namespace, cluster)
        job.task = asyncio.create_task(self._run(job, work), name=f"repository work {namespace}/{cluster}")

    async def _run(self, job: Job, work: Callable[[], Coroutine[Any, Any, int]]) -> None:
        try:
            async with asyncio.timeout(self.deadline):
                job.deleted = await work()
        except TimeoutError:
            job.error = f"not done within the deadline of {self.deadline:g}s"
        except Exception as exc:  # reported in status by the next pass; the task must not die unobserved
            job.error = str(exc) or type(exc).__name__
        if job.error is not None:
            log.warning("repository work failed", cluster=job.cluster, namespace=job.namespace, error=job.error)

    def claim(self, uid: str) -> Job:
        """The ended job's outcome. A success forgets the cluster; a failure counts towards the backoff."""
        memory = self.memory[uid]
        job = memory.job
        assert job is not None  # next_step said done or failed
        memory.job = None
        if job.error is None:
            del self.memory[uid]
        else:
            memory.failures += 1
            memory.last_error = job.error
            memory.not_before = self.clock() + backoff(memory.failures)
        return job

    def sweep(self, alive: Collection[str]) -> None:
        """Forget (and stop) what is remembered of clusters that are gone (e.g. a finalizer removed by hand)."""
        for uid in [uid for uid in self.memory if uid not in alive]:
            job = self.memory.pop(uid).job
            if job is not None and job.task is not None:
                job.task.cancel()

    async def aclose(self) -> None:
        """Cancel every running job and wait for them (shutdown)."""
        tasks = [m.job.task for m in self.memory.values() if m.job is not None and m.job.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
