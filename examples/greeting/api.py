"""The Greeting kind, version ``v1``: the hub of its conversions and the version objects are stored in."""

from __future__ import annotations

from pydantic import Field

from kanri import runtime as kr


class GreetingPublish(kr.KubeModel):
    key: str = "message"
    """The ConfigMap key holding the message."""


class GreetingSpec(kr.KubeModel):
    message: str
    """The text to put in the ConfigMap."""
    publish: GreetingPublish | None = None
    """Where the message goes in the ConfigMap (default: key ``message``)."""
    language: str | None = None
    """The message's language (a BCP 47 tag such as ``ja``), published under the key ``language``."""


class GreetingStatus(kr.KubeModel):
    observed_generation: int | None = None
    conditions: kr.Conditions = Field(default_factory=list)


class Greeting(kr.CustomResource, group="example.kanri.dev", version="v1", kind="Greeting", plural="greetings",
               short_names=("gr",), printer_columns=(kr.PrinterColumn("Message", ".spec.message"),)):  # fmt: skip
    """A message the operator publishes as a ConfigMap."""

    spec: GreetingSpec
    status: GreetingStatus | None = None


GREETING = Greeting.resource.api_kind
