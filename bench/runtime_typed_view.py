"""What typed read access to a cached object costs: a raw dict, the same dict through a generated view
(``kanri.runtime.as_view``), and a copy into the pydantic model (``Model.model_validate``), each reading the three
fields a CronJob reconciler reads first.

    .venv/bin/python bench/runtime_typed_view.py

Prints a Markdown section for docs/benchmarks.md: nanoseconds per read of one object (best of 7 rounds).
"""

from __future__ import annotations

import platform
import timeit
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from pydantic import Field

from kanri import runtime as kr

if TYPE_CHECKING:
    from typing_extensions import ReadOnly

ROUNDS = 7


class JobTemplate(kr.KubeModel):
    image: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class CronJobSpec(kr.KubeModel):
    schedule: str
    successful_jobs_history_limit: int = 3
    failed_jobs_history_limit: int = 1
    suspend: bool | None = None
    job_template: JobTemplate


class CronJobStatus(kr.KubeModel):
    last_schedule_time: kr.Time | None = None
    active: list[dict[str, Any]] = Field(default_factory=list)
    conditions: kr.Conditions = Field(default_factory=list)


class CronJob(kr.CustomResource, group="batch.tutorial.kanri.dev", version="v1", kind="CronJob", plural="cronjobs"):
    spec: CronJobSpec
    status: CronJobStatus | None = None


# What view_source(CronJob) generates, in short (the bench reads only these keys).
class CronJobSpecView(TypedDict):
    schedule: ReadOnly[str]
    successfulJobsHistoryLimit: ReadOnly[int]
    suspend: ReadOnly[NotRequired[bool]]


class CronJobView(TypedDict):
    metadata: ReadOnly[kr.ObjectMetaView]
    spec: ReadOnly[CronJobSpecView]


OBJECT: dict[str, Any] = {
    "apiVersion": "batch.tutorial.kanri.dev/v1",
    "kind": "CronJob",
    "metadata": {
        "name": "nightly-report",
        "namespace": "reports",
        "uid": "6f1c1f2e-0d5b-4f55-9b39-2f6f1f0f1c11",
        "resourceVersion": "48213",
        "generation": 4,
        "creationTimestamp": "2026-12-01T08:00:00Z",
        "labels": {"app.kubernetes.io/name": "report", "team": "finance"},
        "annotations": {"kanri.dev/note": "runs after the close"},
        "finalizers": ["batch.tutorial.kanri.dev/cleanup"],
    },
    "spec": {
        "schedule": "30 2 * * *",
        "successfulJobsHistoryLimit": 3,
        "failedJobsHistoryLimit": 1,
        "jobTemplate": {
            "image": "registry.local/report:1.4",
            "args": ["--month", "current", "--format", "pdf"],
            "env": {"TZ": "UTC", "LOG_LEVEL": "info"},
        },
    },
    "status": {
        "lastScheduleTime": "2026-12-06T02:30:00Z",
        "active": [{"apiVersion": "batch/v1", "kind": "Job", "name": "nightly-report-29412", "namespace": "reports"}],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "observedGeneration": 4,
                "lastTransitionTime": "2026-12-01T08:00:05Z",
                "reason": "Scheduled",
                "message": "next run at 02:30 UTC",
            }
        ],
    },
}


def raw() -> tuple[str, int, str]:
    return OBJECT["spec"]["schedule"], OBJECT["spec"]["successfulJobsHistoryLimit"], OBJECT["metadata"]["name"]


def view() -> tuple[str, int, str]:
    job = kr.as_view(OBJECT, CronJobView)
    return job["spec"]["schedule"], job["spec"]["successfulJobsHistoryLimit"], job["metadata"]["name"]


def model() -> tuple[str, int, str]:
    job = CronJob.model_validate(OBJECT)
    return job.spec.schedule, job.spec.successful_jobs_history_limit, str(job.metadata["name"])


def nanoseconds(read: Callable[[], object]) -> float:
    timer = timeit.Timer(read)
    number, _ = timer.autorange()
    return min(timer.repeat(ROUNDS, number)) / number * 1e9


def main() -> None:
    assert raw() == view() == model()
    figures = {"raw dict": nanoseconds(raw), "as_view": nanoseconds(view), "model_validate": nanoseconds(model)}
    base = figures["raw dict"]
    print("## Typed read access to a cached object (bench/runtime_typed_view.py)\n")
    print(f"Python {platform.python_version()}, one CronJob object (spec, metadata, a status with one condition);")
    print("three fields read per call; best of 7 rounds.\n")
    print("| access | ns per read | vs raw dict |")
    print("|---|---:|---:|")
    for name, value in figures.items():
        print(f"| {name} | {value:,.0f} | {value / base:.1f}x |")


if __name__ == "__main__":
    main()
