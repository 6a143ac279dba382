"""A permanent error's condition must not vanish: a controller whose CRD would prune ``status.conditions`` warns at
start-up (naming the fix), and warns again whenever the API server's answer to its status write lacks the
condition. Checked against CRDs generated from models, and a controller wired to an in-memory client."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest
import structlog
from pydantic import ConfigDict, Field

from examples.greeting.operator import Greeting
from kanri.runtime import (
    ApiError,
    Conditions,
    Controller,
    ControllerOptions,
    CustomResource,
    KubeModel,
    PermanentError,
    crd_for,
)
from kanri.runtime._status_schema import conditions_problem
from kanri.runtime.kinds import CONFIG_MAP, CRD

Obj = dict[str, Any]
GROUP = "schema.kanri.dev"


class Spec(KubeModel):
    schedule: str


class BareStatus(KubeModel):
    last_schedule_time: str | None = None


class LooseStatus(KubeModel):
    model_config = ConfigDict(extra="allow")
    last_schedule_time: str | None = None


class FreeConditionsStatus(KubeModel):
    conditions: list[dict[str, Any]] = Field(default_factory=list)


class WordConditionsStatus(KubeModel):
    conditions: list[str] = Field(default_factory=list)


class FullStatus(KubeModel):
    conditions: Conditions = Field(default_factory=list)


class CronJob(CustomResource, group=GROUP, version="v1", kind="CronJob", plural="cronjobs"):
    """The newcomer's resource: a status without conditions."""

    spec: Spec
    status: BareStatus | None = None


class NoStatus(CustomResource, group=GROUP, version="v1", kind="NoStatus", plural="nostatuses"):
    spec: Spec


class StatusButNoField(
    CustomResource, group=GROUP, version="v1", kind="Declared", plural="declareds", status_subresource=True
):
    spec: Spec


class FreeStatus(CustomResource, group=GROUP, version="v1", kind="Free", plural="frees"):
    spec: Spec
    status: dict[str, Any] | None = None


class FreeConditions(CustomResource, group=GROUP, version="v1", kind="FreeConds", plural="freeconds"):
    spec: Spec
    status: FreeConditionsStatus | None = None


class WordConditions(CustomResource, group=GROUP, version="v1", kind="Words", plural="words"):
    spec: Spec
    status: WordConditionsStatus | None = None


class Full(CustomResource, group=GROUP, version="v1", kind="Full", plural="fulls"):
    spec: Spec
    status: FullStatus | None = None


def test_a_status_without_conditions_is_named_with_the_fix() -> None:
    problem = conditions_problem(crd_for(CronJob), "v1")
    assert problem is not None
    assert "CRD cronjobs.schema.kanri.dev version v1 declares no status.conditions" in problem
    assert "kanri.runtime.Conditions" in problem
    assert "permanent_error_condition=None" in problem


def test_a_kind_without_a_status_subresource_is_named() -> None:
    problem = conditions_problem(crd_for(NoStatus), "v1")
    assert problem is not None
    assert "has no status subresource" in problem


def test_a_status_subresource_without_a_status_schema_is_named() -> None:
    problem = conditions_problem(crd_for(StatusButNoField), "v1")
    assert problem is not None
    assert "declares no status:" in problem


def test_condition_items_that_are_not_conditions_are_named() -> None:
    problem = conditions_problem(crd_for(WordConditions), "v1")
    assert problem is not None
    assert "items lack type, status, lastTransitionTime, reason, message" in problem


@pytest.mark.parametrize("resource", [Greeting, Full, FreeStatus, FreeConditions])
def test_schemas_that_keep_a_condition_pass(resource: type[CustomResource]) -> None:
    assert conditions_problem(crd_for(resource), resource.resource.version) is None


def test_a_version_the_crd_does_not_serve_is_not_judged() -> None:
    assert conditions_problem(crd_for(CronJob), "v2") is None


def test_a_status_model_that_allows_extra_fields_keeps_the_condition() -> None:
    # extra="allow" becomes x-kubernetes-preserve-unknown-fields on status: nothing is pruned there.
    class Loose(CustomResource, group=GROUP, version="v1", kind="Loose", plural="looses"):
        spec: Spec
        status: LooseStatus | None = None

    assert conditions_problem(crd_for(Loose), "v1") is None


# --- the controller -------------------------------------------------------------------------------------------------

CRON_JOB_KIND = CronJob.resource.api_kind


class SchemaClient:
    """Serves one CRD; status patches are answered as the API server answers them after pruning."""

    def __init__(
        self, crd: Obj | None = None, *, refuse: int | None = None, refuse_patch: int | None = None, prune: bool = True
    ) -> None:
        self.crd = crd
        self.refuse = refuse
        self.refuse_patch = refuse_patch
        self.prune = prune
        self.gets: list[str] = []

    async def get(self, kind: Any, name: str, namespace: str | None = None) -> Obj:
        self.gets.append(name)
        if self.refuse is not None:
            raise ApiError(self.refuse, {"message": "refused"})
        if kind != CRD or self.crd is None or name != self.crd["metadata"]["name"]:
            raise ApiError(404, {"reason": "NotFound"})
        return self.crd

    async def patch_status(
        self, kind: Any, name: str, patch: Obj, namespace: str | None = None, *, field_manager: str | None = None
    ) -> Obj:
        if self.refuse_patch is not None:
            raise ApiError(self.refuse_patch, {"message": "refused"})
        status = {} if self.prune else patch["status"]
        return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "9"}, "status": status}


async def _noop(_: Any) -> None:
    return None


def check(client: SchemaClient, kind: Any = CRON_JOB_KIND, **options: Any) -> list[MutableMapping[str, Any]]:
    controller = Controller("cronjob", _noop, for_kind=kind, options=ControllerOptions(**options))
    controller._client = client  # type: ignore[assignment]
    with structlog.testing.capture_logs() as logs:
        asyncio.run(asyncio.wait_for(controller._check_status_schema(), 5))
    return [entry for entry in logs if entry["log_level"] == "warning"]


def test_a_controller_warns_at_start_up_when_its_crd_would_prune_the_condition() -> None:
    client = SchemaClient(crd_for(CronJob))
    (warning,) = check(client)
    assert warning["event"] == "permanent errors will not show in status"
    assert warning["condition"] == "Ready"
    assert "declares no status.conditions" in warning["problem"]
    assert client.gets == ["cronjobs.schema.kanri.dev"]


def test_a_controller_whose_crd_keeps_conditions_says_nothing() -> None:
    client = SchemaClient(crd_for(Greeting))
    assert check(client, Greeting.resource.api_kind) == []
    assert client.gets == ["greetings.example.kanri.dev"]


def test_no_check_without_a_permanent_error_condition_or_for_a_built_in_kind() -> None:
    client = SchemaClient(crd_for(CronJob))
    assert check(client, permanent_error_condition=None) == []
    assert check(client, CONFIG_MAP) == []
    assert client.gets == []


@pytest.mark.parametrize("status", [403, 500])
def test_a_crd_the_operator_may_not_read_does_not_stop_the_controller(status: int) -> None:
    client = SchemaClient(crd_for(CronJob), refuse=status)
    assert check(client) == []
    assert client.gets == ["cronjobs.schema.kanri.dev"]


def report(client: SchemaClient) -> list[MutableMapping[str, Any]]:
    controller = Controller("cronjob", _noop, for_kind=CRON_JOB_KIND)
    controller._client = client  # type: ignore[assignment]
    seen = {"metadata": {"name": "nightly", "namespace": "ns", "resourceVersion": "8", "generation": 1}}
    error = PermanentError("InvalidSchedule", "spec.schedule is not a cron expression")
    with structlog.testing.capture_logs() as logs:
        asyncio.run(asyncio.wait_for(controller._report_permanent(seen, error), 5))
    return [entry for entry in logs if entry["log_level"] == "warning"]


def test_a_condition_the_api_server_dropped_from_the_write_is_reported_in_the_log() -> None:
    (warning,) = report(SchemaClient(prune=True))
    assert warning["event"].startswith("the API server dropped the permanent error's condition")
    assert warning["reason"] == "InvalidSchedule"
    assert warning["error"] == "spec.schedule is not a cron expression"


def test_a_condition_the_api_server_kept_is_not_reported() -> None:
    assert report(SchemaClient(prune=False)) == []


def test_a_status_write_answered_404_says_why_that_may_be() -> None:
    (warning,) = report(SchemaClient(refuse_patch=404))
    assert warning["status"] == 404
    assert "no status subresource" in warning["hint"]
