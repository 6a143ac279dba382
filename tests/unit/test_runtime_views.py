"""Typed views of cached objects: generated from the model, read-only, free at run time, and a key typo is a mypy
error. The Greeting example's views are the generator's current output."""

from __future__ import annotations

import enum
import os
import types
from pathlib import Path
from typing import Annotated, Any, ForwardRef, Literal

from mypy import api as mypy_api
from pydantic import Field

from examples.greeting.operator import Greeting
from kanri.runtime import (
    Conditions,
    CustomResource,
    IntOrString,
    KubeModel,
    Quantity,
    Time,
    as_view,
    list_map,
    view_source,
)

ROOT = Path(__file__).resolve().parents[2]


class Policy(enum.Enum):
    RETAIN = "Retain"
    DELETE = "Delete"


class Port(KubeModel):
    name: str
    number: int


class JobTemplate(KubeModel):
    """What each run starts."""

    image: str
    args: list[str] = Field(default_factory=list)


class Window(KubeModel):
    from_: Annotated[int, Field(alias="from")]
    to: int


class CronJobSpec(KubeModel):
    schedule: str
    """A cron expression, in UTC."""
    successful_jobs_history_limit: int = 3
    """How many finished jobs to keep."""
    suspend: bool | None = None
    concurrency_policy: Literal["Allow", "Forbid", "Replace"] = "Allow"
    deletion_policy: Policy | None = None
    size: Quantity = "1Gi"
    max_unavailable: IntOrString | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    extra: dict[str, Any] | None = None
    job_template: JobTemplate
    ports: Annotated[list[Port], list_map("name")] = Field(default_factory=list)
    window: Window | None = None


class CronJobStatus(KubeModel):
    last_schedule_time: Time | None = None
    active: int | None = None
    conditions: Conditions = Field(default_factory=list)


class CronJob(CustomResource, group="batch.kanri.dev", version="v1", kind="CronJob", plural="cronjobs"):
    """Runs a job on a schedule."""

    spec: CronJobSpec
    status: CronJobStatus | None = None


def load(source: str) -> types.ModuleType:
    module = types.ModuleType("generated_views")
    exec(compile(source, "generated_views.py", "exec"), module.__dict__)
    return module


def declared(view: Any) -> dict[str, str]:
    # Class-syntax views keep their annotations as strings; the functional form as ForwardRefs.
    return {
        key: value.__forward_arg__ if isinstance(value, ForwardRef) else value
        for key, value in view.__annotations__.items()
    }


def test_a_view_has_the_wire_names_and_types_the_api_server_stores() -> None:
    views = load(view_source(CronJob))
    assert declared(views.CronJobView) == {
        "apiVersion": "ReadOnly[str]",
        "kind": "ReadOnly[str]",
        "metadata": "ReadOnly[ObjectMetaView]",
        "spec": "ReadOnly[CronJobSpecView]",
        "status": "ReadOnly[NotRequired[CronJobStatusView]]",
    }
    assert declared(views.CronJobSpecView) == {
        "schedule": "ReadOnly[str]",
        "successfulJobsHistoryLimit": "ReadOnly[int]",  # a default: the API server fills it in
        "suspend": "ReadOnly[NotRequired[bool]]",
        "concurrencyPolicy": "ReadOnly[Literal['Allow', 'Forbid', 'Replace']]",  # Python re-quotes annotations
        "deletionPolicy": "ReadOnly[NotRequired[Literal['Retain', 'Delete']]]",
        "size": "ReadOnly[int | str]",
        "maxUnavailable": "ReadOnly[NotRequired[int | str]]",
        "labels": "ReadOnly[NotRequired[Mapping[str, str]]]",
        "extra": "ReadOnly[NotRequired[Mapping[str, Any]]]",
        "jobTemplate": "ReadOnly[JobTemplateView]",
        "ports": "ReadOnly[NotRequired[Sequence[PortView]]]",
        "window": "ReadOnly[NotRequired[WindowView]]",
    }
    assert declared(views.CronJobStatusView) == {
        "lastScheduleTime": "ReadOnly[NotRequired[str]]",  # RFC 3339 on the wire: parse_optional_time
        "active": "ReadOnly[NotRequired[int]]",
        "conditions": "ReadOnly[NotRequired[Sequence[ConditionView]]]",
    }
    # A key that is a Python keyword: the functional TypedDict form.
    assert declared(views.WindowView) == {"from": "ReadOnly[int]", "to": "ReadOnly[int]"}


def test_field_descriptions_become_docstrings() -> None:
    source = view_source(CronJob)
    assert '    schedule: ReadOnly[str]\n    """A cron expression, in UTC."""\n' in source
    assert 'class JobTemplateView(TypedDict):\n    """What each run starts."""\n' in source
    assert 'class CronJobView(TypedDict):\n    """Runs a job on a schedule."""\n' in source


def test_as_view_is_the_same_object() -> None:
    raw: dict[str, Any] = {"metadata": {"name": "n"}, "spec": {"message": "hi"}}
    assert as_view(raw, dict) is raw
    assert as_view(None, dict) is None


def test_the_greeting_examples_views_are_current() -> None:
    committed = (ROOT / "examples/greeting/views.py").read_text()
    assert committed == view_source(Greeting), "regenerate examples/greeting/views.py (see docs/runtime-helpers.md)"


MISUSE = """\
from views import GreetingView


def message(greeting: GreetingView) -> str:
    greeting["spec"]["message"] = "changed"
    return greeting["spec"]["mesage"]
"""

USE = """\
from collections.abc import Sequence

from views import ConditionView, GreetingView


def message(greeting: GreetingView) -> str:
    return greeting["spec"]["message"]


def conditions(greeting: GreetingView) -> Sequence[ConditionView]:
    return greeting.get("status", {}).get("conditions", [])
"""


def test_mypy_refuses_a_key_typo_and_a_write_through_a_view(tmp_path: Path) -> None:
    (tmp_path / "views.py").write_text((ROOT / "examples/greeting/views.py").read_text())
    (tmp_path / "misuse.py").write_text(MISUSE)
    (tmp_path / "use.py").write_text(USE)
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        arguments = ["--strict", "--follow-imports=skip", "--no-incremental", "--cache-dir=/dev/null"]
        report, _, status = mypy_api.run([*arguments, "views.py", "misuse.py", "use.py"])
    finally:
        os.chdir(cwd)
    errors = [line for line in report.splitlines() if ": error:" in line]
    assert status == 1
    assert 'misuse.py:5: error: ReadOnly TypedDict key "message" TypedDict is mutated' in report
    assert 'misuse.py:6: error: TypedDict "GreetingSpecView" has no key "mesage"' in report
    assert all(line.startswith("misuse.py") for line in errors), report  # the views and correct use are clean


def _item_a() -> type[KubeModel]:
    class Item(KubeModel):
        name: str

    return Item


def _item_b() -> type[KubeModel]:
    class Item(KubeModel):
        from_: Annotated[int, Field(alias="from")]

    return Item


ItemA = _item_a()
ItemB = _item_b()


class Both(KubeModel):
    first: ItemA  # type: ignore[valid-type]
    second: ItemB  # type: ignore[valid-type]


class Pair(CustomResource, group="batch.kanri.dev", version="v1", kind="Pair", plural="pairs"):
    spec: Both


def test_two_models_of_one_name_get_two_views() -> None:
    views = load(view_source(Pair))
    assert declared(views.BothView) == {"first": "ReadOnly[ItemView]", "second": "ReadOnly[ItemView2]"}
    assert declared(views.ItemView) == {"name": "ReadOnly[str]"}
    assert declared(views.ItemView2) == {"from": "ReadOnly[int]"}
    assert views.ItemView2.__name__ == "ItemView2"  # the functional form names itself as its variable
