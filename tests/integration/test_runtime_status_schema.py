"""A permanent error on a kind whose status has no ``conditions``, on the real API server: the server prunes the
runtime's Ready=False condition and answers with success, and the controller says so — once at start-up (from the
CRD it reads) and at the write — instead of letting the reason vanish. A kind that keeps conditions gets neither."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import structlog

from examples.greeting.operator import GREETING, Greeting
from kanri.runtime import (
    Client,
    Controller,
    ControllerOptions,
    CustomResource,
    KubeModel,
    Manager,
    ManagerOptions,
    PermanentError,
    Request,
    install_crd,
)
from tests.support import eventually

Obj = dict[str, Any]
Logs = list[MutableMapping[str, Any]]


class TutorialSpec(KubeModel):
    schedule: str


class TutorialStatus(KubeModel):
    last_schedule_time: str | None = None


class TutorialCronJob(CustomResource, group="tutorial.kanri.dev", version="v1", kind="CronJob", plural="cronjobs"):
    """The newcomer's CronJob: a status without conditions."""

    spec: TutorialSpec
    status: TutorialStatus | None = None


CRON_JOB = TutorialCronJob.resource.api_kind


async def refuse(request: Request) -> None:
    raise PermanentError("InvalidSchedule", "spec.schedule is not a cron expression")


@contextlib.asynccontextmanager
async def running(client: Client, namespace: str, kind: Any) -> AsyncIterator[None]:
    options = ManagerOptions(name="schema", namespace=namespace, leader_election=False, health_port=None)
    manager = Manager(client, options)
    manager.add(Controller("schema", refuse, for_kind=kind, options=ControllerOptions(resync_period=None)))
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        yield
    finally:
        await manager.stop()
        await asyncio.wait_for(task, 20)


def events(logs: Logs, event: str) -> Logs:
    return [entry for entry in logs if entry["event"].startswith(event)]


async def test_a_status_without_conditions_is_warned_about_at_start_up_and_at_the_write(
    client: Client, namespace: str
) -> None:
    await install_crd(client, TutorialCronJob, field_manager="kanri-tests")
    await client.create(CRON_JOB, {"metadata": {"name": "nightly", "namespace": namespace},
                                   "spec": {"schedule": "every night"}})  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        async with running(client, namespace, CRON_JOB):
            dropped = await eventually(
                lambda: asyncio.sleep(0, events(logs, "the API server dropped the permanent error's condition")),
                timeout=30,
            )
    (start_up,) = events(logs, "permanent errors will not show in status")
    assert "CRD cronjobs.tutorial.kanri.dev version v1 declares no status.conditions" in start_up["problem"]
    assert dropped[0]["reason"] == "InvalidSchedule"
    # The fact both warnings are about: the write succeeded, and nothing of it is left.
    stored = await client.get(CRON_JOB, "nightly", namespace)
    assert "conditions" not in (stored.get("status") or {})


async def test_a_status_with_conditions_gets_the_condition_and_no_warning(client: Client, namespace: str) -> None:
    await install_crd(client, Greeting, field_manager="kanri-tests")
    await client.create(GREETING, {"metadata": {"name": "rude", "namespace": namespace}, "spec": {"message": "x"}})

    async def ready() -> Obj | None:
        stored = await client.get(GREETING, "rude", namespace)
        return next((c for c in (stored.get("status") or {}).get("conditions") or () if c["type"] == "Ready"), None)

    with structlog.testing.capture_logs() as logs:
        async with running(client, namespace, GREETING):
            condition = await eventually(ready, timeout=30)
    assert condition["reason"] == "InvalidSchedule"
    assert events(logs, "permanent errors will not show in status") == []
    assert events(logs, "the API server dropped") == []
