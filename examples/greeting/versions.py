"""Greeting's older version, ``v1alpha1``, still served (deprecated) beside ``v1``, and the conversion between them.

What changed in v1: ``text`` was renamed ``message`` and ``key`` moved under ``publish`` (room for more publishing
options); ``language`` is new and has no place in v1alpha1, so reading a v1 object through v1alpha1 keeps it in an
annotation and writing it back through v1alpha1 restores it (kanri.runtime.Conversion does that for every spoke).
"""

from __future__ import annotations

from pydantic import Field

from examples.greeting.api import Greeting, GreetingPublish, GreetingSpec, GreetingStatus
from kanri import runtime as kr

DEPRECATION = (
    "example.kanri.dev/v1alpha1 Greeting is deprecated and will be removed after 2027-06-30; use example.kanri.dev/v1"
)


class GreetingSpecV1Alpha1(kr.KubeModel):
    text: str
    """The text to put in the ConfigMap (``message`` in v1)."""
    key: str | None = None
    """The ConfigMap key holding the text (default ``message``; ``publish.key`` in v1)."""


class GreetingStatusV1Alpha1(kr.KubeModel):
    observed_generation: int | None = None
    conditions: kr.Conditions = Field(default_factory=list)


class GreetingV1Alpha1(kr.CustomResource, group="example.kanri.dev", version="v1alpha1", kind="Greeting",
                       plural="greetings", short_names=("gr",), storage=False, deprecation_warning=DEPRECATION,
                       printer_columns=(kr.PrinterColumn("Text", ".spec.text"),)):  # fmt: skip
    """A message the operator publishes as a ConfigMap (deprecated version: use v1)."""

    spec: GreetingSpecV1Alpha1
    status: GreetingStatusV1Alpha1 | None = None


def to_v1(old: GreetingV1Alpha1) -> Greeting:
    publish = GreetingPublish(key=old.spec.key) if old.spec.key is not None else None
    status = GreetingStatus.model_validate(old.status.model_dump()) if old.status is not None else None
    return Greeting(spec=GreetingSpec(message=old.spec.text, publish=publish), status=status)


def from_v1(new: Greeting) -> GreetingV1Alpha1:
    key = new.spec.publish.key if new.spec.publish is not None else None
    status = GreetingStatusV1Alpha1.model_validate(new.status.model_dump()) if new.status is not None else None
    return GreetingV1Alpha1(spec=GreetingSpecV1Alpha1(text=new.spec.message, key=key), status=status)


GREETINGS = kr.Conversion(Greeting)
"""Greeting's versions: v1 the hub, v1alpha1 a spoke."""
GREETINGS.spoke(GreetingV1Alpha1, to_hub=to_v1, from_hub=from_v1)
