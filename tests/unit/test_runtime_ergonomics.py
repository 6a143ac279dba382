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
from typer.testing import CliRunner

from kanri.cli.main import app
from kanri.runtime import (
    ApiError,
    Informer,
    Manager,
    ManagerOptions,
    WatchTiming,
    format_time,
    parse_time,
    update_status,
)
from kanri.runtime.kinds import CONFIG_MAP, CRON_JOB, JOB

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
