"""What a new user meets first: time helpers, the status helper, API error reasons, an awaitable stop, where the
health server listens, the built-in kinds, and docs that import only the public API."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from kanri.cli.main import app
from kanri.runtime import (
    ApiError,
    Condition,
    Informer,
    KubeModel,
    Manager,
    ManagerOptions,
    Time,
    WatchTiming,
    creation_time,
    deletion_time,
    format_time,
    object_reference,
    parse_optional_time,
    parse_time,
    update_status,
)
from kanri.runtime.kinds import CONFIG_MAP, CRON_JOB, JOB, NAMESPACE

ROOT = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]


# --- times ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-05-01T12:00:00Z", datetime(2026, 5, 1, 12, tzinfo=UTC)),
        ("2026-05-01T12:00:00.123456Z", datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)),
        ("2026-05-01T14:00:00+02:00", datetime(2026, 5, 1, 12, tzinfo=UTC)),
    ],
)
def test_parse_time_reads_what_the_api_server_writes(text: str, expected: datetime) -> None:
    parsed = parse_time(text)
    assert parsed == expected
    assert parsed.tzinfo == UTC


@pytest.mark.parametrize("text", ["", "yesterday", "2026-05-01", "2026-05-01T12:00:00", "2026-05-01 12:00:00Z"])
def test_parse_time_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time(text)


def test_format_time_is_the_inverse_to_the_second() -> None:
    moment = datetime(2026, 5, 1, 14, 0, 7, 999, tzinfo=timezone(timedelta(hours=2)))
    assert format_time(moment) == "2026-05-01T12:00:07Z"
    assert parse_time(format_time(moment)) == moment.replace(microsecond=0)
    with pytest.raises(ValueError, match="timezone-aware"):
        format_time(datetime(2026, 5, 1))


def test_metadata_times_are_read_from_a_raw_object() -> None:
    obj = {"metadata": {"creationTimestamp": "2026-05-01T12:00:00Z", "deletionTimestamp": "2026-05-01T13:00:00Z"}}
    assert creation_time(obj) == datetime(2026, 5, 1, 12, tzinfo=UTC)
    assert deletion_time(obj) == datetime(2026, 5, 1, 13, tzinfo=UTC)
    assert deletion_time({"metadata": {"creationTimestamp": "2026-05-01T12:00:00Z"}}) is None
    with pytest.raises(ValueError, match="creationTimestamp"):
        creation_time({"metadata": {"name": "built-in-code"}})


def test_an_optional_time_is_none_when_absent_and_refused_when_malformed() -> None:
    assert parse_optional_time(None) is None
    assert parse_optional_time("") is None
    assert parse_optional_time("2026-05-01T12:00:00Z") == datetime(2026, 5, 1, 12, tzinfo=UTC)
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_optional_time("2026-05-01T12:00:00")


class Schedule(KubeModel):
    last_schedule_time: Time | None = None


def test_a_time_field_is_parsed_by_the_model_into_an_aware_utc_datetime() -> None:
    parsed = Schedule.model_validate({"lastScheduleTime": "2026-05-01T14:00:00+02:00"})
    assert parsed.last_schedule_time == datetime(2026, 5, 1, 12, tzinfo=UTC)
    assert parsed.last_schedule_time is not None
    assert parsed.last_schedule_time.tzinfo == UTC
    assert parsed.model_dump(mode="json") == {"lastScheduleTime": "2026-05-01T12:00:00Z"}
    micro = Schedule.model_validate({"lastScheduleTime": "2026-05-01T12:00:00.250000Z"})
    assert micro.model_dump(mode="json") == {"lastScheduleTime": "2026-05-01T12:00:00.250000Z"}
    assert Schedule.model_json_schema()["properties"]["lastScheduleTime"]["anyOf"][0] == {
        "type": "string",
        "format": "date-time",
    }


def test_a_condition_model_reads_its_transition_time_as_a_time() -> None:
    wire = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-05-01T14:00:00+02:00", "reason": "Up",
            "message": ""}  # fmt: skip
    condition = Condition.model_validate(wire)
    assert condition.last_transition_time == datetime(2026, 5, 1, 12, tzinfo=UTC)
    assert condition.model_dump(mode="json")["lastTransitionTime"] == "2026-05-01T12:00:00Z"
    with pytest.raises(ValidationError, match="RFC 3339"):
        Condition.model_validate({**wire, "lastTransitionTime": "2026-05-01T12:00:00"})


@pytest.mark.parametrize("value", ["2026-05-01T12:00:00", "2026-05-01", 1700000000, datetime(2026, 5, 1)])
def test_a_time_field_refuses_naive_times_bare_dates_and_numbers(value: object) -> None:
    with pytest.raises(ValidationError, match=r"RFC 3339|timezone-aware"):
        Schedule.model_validate({"lastScheduleTime": value})


# --- update_status --------------------------------------------------------------------------------------------------


class StatusClient:
    def __init__(self) -> None:
        self.patches: list[tuple[str, Obj, str | None]] = []

    async def patch_status(
        self, kind: Any, name: str, patch: Obj, namespace: str | None = None, *, field_manager: str | None = None
    ) -> Obj:
        self.patches.append((name, patch, field_manager))
        return {}


NOW = datetime(2026, 5, 1, 12, tzinfo=UTC)
READY = {"type": "Ready", "status": True, "reason": "Published", "message": "ok"}


def greeting(status: Obj | None = None) -> Obj:
    meta = {"name": "g", "namespace": "ns", "generation": 2, "resourceVersion": "41"}
    return {"metadata": meta, **({"status": status} if status is not None else {})}


def update(obj: Obj, **kwargs: Any) -> tuple[bool, StatusClient]:
    client = StatusClient()
    wrote = asyncio.run(update_status(client, CONFIG_MAP, obj, now=NOW, **kwargs))  # type: ignore[arg-type]
    return wrote, client


def test_update_status_writes_fields_and_conditions_that_differ_guarded_by_the_resource_version() -> None:
    other = {
        "type": "Other",
        "status": "True",
        "reason": "X",
        "message": "",
        "lastTransitionTime": "2020-01-01T00:00:00Z",
    }
    obj = greeting({"observedGeneration": 1, "phase": "Running", "conditions": [other]})
    wrote, client = update(obj, fields={"observedGeneration": 2, "phase": "Running"}, conditions=[READY])
    assert wrote
    ((name, patch, _),) = client.patches
    assert name == "g"
    assert patch["metadata"] == {"resourceVersion": "41"}
    assert set(patch["status"]) == {"observedGeneration", "conditions"}  # phase already said Running
    assert patch["status"]["conditions"] == [other, {"type": "Ready", "status": "True", "observedGeneration": 2,
                                                     "lastTransitionTime": "2026-05-01T12:00:00Z",
                                                     "reason": "Published", "message": "ok"}]  # fmt: skip
    assert obj["status"]["conditions"] == [other]  # the cached object is not changed


def test_update_status_sends_nothing_when_the_status_already_says_it() -> None:
    ready = {"type": "Ready", "status": "True", "observedGeneration": 2, "lastTransitionTime": "2026-01-01T00:00:00Z",
             "reason": "Published", "message": "ok"}  # fmt: skip
    wrote, client = update(greeting({"observedGeneration": 2, "conditions": [ready]}),
                           fields={"observedGeneration": 2}, conditions=[READY])  # fmt: skip
    assert not wrote
    assert client.patches == []


def test_update_status_fields_alone_are_an_unguarded_patch_of_just_those_fields() -> None:
    wrote, client = update(greeting(), fields={"phase": "Pending"}, field_manager="me")
    assert wrote
    assert client.patches == [("g", {"status": {"phase": "Pending"}}, "me")]


# --- errors and logs ------------------------------------------------------------------------------------------------


def test_an_error_without_a_status_body_gets_the_reason_of_its_http_status() -> None:
    error = ApiError.from_bytes(404, b"404 page not found", method="GET", path="/apis/example.kanri.dev/v1/widgets")
    assert error.reason == "NotFound"
    assert str(error) == "GET /apis/example.kanri.dev/v1/widgets: 404 NotFound: 404 page not found"
    assert ApiError(418).reason == "HTTP418"
    assert ApiError(422, {"reason": "Invalid", "message": "m"}).reason == "Invalid"


def test_already_exists_tells_a_taken_name_from_a_stale_write() -> None:
    taken = ApiError(409, {"reason": "AlreadyExists", "message": 'jobs.batch "backup" already exists'})
    stale = ApiError(409, {"reason": "Conflict", "message": "the object has been modified"})
    assert taken.already_exists
    assert taken.conflict  # still a 409 for code that only asks that
    assert not stale.already_exists
    assert stale.conflict
    assert not ApiError(409).already_exists  # no Status body: nothing says the name was taken
    assert not ApiError(404, {"reason": "AlreadyExists"}).already_exists


def test_object_reference_names_an_object_as_events_and_status_fields_do() -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "backup-1", "namespace": "ns", "uid": "u-1", "resourceVersion": "7", "labels": {}},
        "spec": {},
    }
    assert object_reference(job) == {"apiVersion": "batch/v1", "kind": "Job", "name": "backup-1",
                                     "namespace": "ns", "uid": "u-1", "resourceVersion": "7"}  # fmt: skip
    # Built in code: no uid, resourceVersion or type meta yet; the Kind supplies the last.
    assert object_reference({"metadata": {"name": "n", "namespace": "ns"}}, CONFIG_MAP) == {
        "apiVersion": "v1", "kind": "ConfigMap", "name": "n", "namespace": "ns"}  # fmt: skip
    assert object_reference({"metadata": {"name": "prod"}}, NAMESPACE) == {
        "apiVersion": "v1", "kind": "Namespace", "name": "prod"}  # fmt: skip


def test_object_reference_refuses_what_it_cannot_name() -> None:
    with pytest.raises(ValueError, match="pass its Kind"):
        object_reference({"metadata": {"name": "n"}})
    with pytest.raises(ValueError, match=r"metadata\.name"):
        object_reference({"metadata": {}}, JOB)
    with pytest.raises(ValueError, match="not a Job"):
        object_reference({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "n"}}, JOB)


def test_a_watch_of_a_kind_not_served_says_to_install_its_crd() -> None:
    informer = Informer(None, JOB, timing=WatchTiming(backoff_base=0.001, backoff_max=0.001))  # type: ignore[arg-type]
    with structlog.testing.capture_logs() as logs:
        asyncio.run(informer._back_off(1, ApiError(404, {"message": "404 page not found"})))
    (entry,) = logs
    assert "404 NotFound" in entry["error"]
    assert "Job.batch/v1 is not served: is its CRD installed and Established? see install_crd" in entry["error"]


# --- the manager ----------------------------------------------------------------------------------------------------


class NoClient:
    def add_write_listener(self, listener: Any) -> None:
        pass


def test_the_health_server_listens_on_this_machine_only_by_default() -> None:
    assert ManagerOptions(name="x").health_host == "127.0.0.1"


def test_the_operator_pod_and_kanri_run_pass_an_address_the_kubelets_probes_reach() -> None:
    manifests = list(yaml.safe_load_all((ROOT / "deploy/operator/operator.yaml").read_text()))
    (deployment,) = [m for m in manifests if m and m["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--health-host=0.0.0.0" in container["args"]
    assert "readinessProbe" in container
    assert "--health-host" in CliRunner().invoke(app, ["run", "--help"]).output


def test_stop_can_be_awaited_and_still_be_called_plainly() -> None:
    async def main() -> None:
        options = ManagerOptions(name="x", leader_election=False, health_port=None)
        manager = Manager(NoClient(), options)  # type: ignore[arg-type]
        await manager.stop()  # not running: returns at once
        manager = Manager(NoClient(), options)  # type: ignore[arg-type]
        task = asyncio.create_task(manager.run(handle_signals=False))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(manager.stop(), 5)  # returns once run() has returned
        assert task.done()
        manager = Manager(NoClient(), options)  # type: ignore[arg-type]
        task = asyncio.create_task(manager.run(handle_signals=False))
        await asyncio.sleep(0.05)
        manager.stop()  # the plain call of synchronous callers (tests/postgres_support.py): no warning, it stops
        await asyncio.wait_for(task, 5)

    asyncio.run(main())


# --- kinds and docs -------------------------------------------------------------------------------------------------


def test_jobs_and_cron_jobs_are_built_in_kinds() -> None:
    assert JOB.path("ns", "backup") == "/apis/batch/v1/namespaces/ns/jobs/backup"
    assert CRON_JOB.path("ns") == "/apis/batch/v1/namespaces/ns/cronjobs"


def test_the_docs_import_only_the_public_runtime_api() -> None:
    private = re.compile(r"(from|import) kanri\.runtime\._\w+")
    offenders = [
        f"{path.name}: {line.strip()}"
        for path in sorted((ROOT / "docs").glob("*.md"))
        for line in path.read_text().splitlines()
        if private.search(line)
    ]
    assert offenders == []
