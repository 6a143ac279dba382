"""The Greeting example's two versions: every valid object converts to the other version and back unchanged."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from examples.greeting.api import Greeting, GreetingPublish, GreetingSpec
from examples.greeting.versions import GREETINGS, GreetingSpecV1Alpha1, GreetingV1Alpha1

V1, V1ALPHA1 = "example.kanri.dev/v1", "example.kanri.dev/v1alpha1"
words = st.text(alphabet="abcこんにちは -", min_size=1, max_size=10)
status = st.none() | st.fixed_dictionaries({"observedGeneration": st.integers(min_value=1, max_value=9)})


def _dump(model: Greeting | GreetingV1Alpha1, meta: dict[str, Any], status: dict[str, Any] | None) -> dict[str, Any]:
    obj = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    obj["metadata"] = meta
    if status is not None:
        obj["status"] = {**status, "conditions": []}
    return obj


@st.composite
def v1_greetings(draw: st.DrawFn) -> dict[str, Any]:
    publish = draw(st.none() | st.builds(GreetingPublish, key=st.sampled_from(["message", "hello", "text"])))
    spec = GreetingSpec(message=draw(words), publish=publish, language=draw(st.none() | st.sampled_from(["ja", "en"])))
    return _dump(Greeting(spec=spec), {"name": "hi", "generation": 2}, draw(status))


@st.composite
def v1alpha1_greetings(draw: st.DrawFn) -> dict[str, Any]:
    spec = GreetingSpecV1Alpha1(text=draw(words), key=draw(st.none() | st.sampled_from(["message", "hello"])))
    return _dump(GreetingV1Alpha1(spec=spec), {"name": "hi", "annotations": {"a": "b"}}, draw(status))


@settings(max_examples=200, deadline=None)
@given(v1_greetings())
def test_v1_to_v1alpha1_and_back_is_unchanged(greeting: dict[str, Any]) -> None:
    old = GREETINGS.convert(greeting, V1ALPHA1)
    assert old["spec"]["text"] == greeting["spec"]["message"]
    assert GREETINGS.convert(old, V1) == greeting


@settings(max_examples=200, deadline=None)
@given(v1alpha1_greetings())
def test_v1alpha1_to_v1_and_back_is_unchanged(greeting: dict[str, Any]) -> None:
    new = GREETINGS.convert(greeting, V1)
    assert new["spec"]["message"] == greeting["spec"]["text"]
    assert new["metadata"] == greeting["metadata"]  # nothing v1alpha1 holds is lost in v1: no annotation
    assert GREETINGS.convert(new, V1ALPHA1) == greeting


def test_the_key_moves_under_publish_and_the_language_waits_in_an_annotation() -> None:
    new = {"apiVersion": V1, "kind": "Greeting", "metadata": {"name": "hi"},
           "spec": {"message": "konnichiwa", "publish": {"key": "hello"}, "language": "ja"}}  # fmt: skip
    old = GREETINGS.convert(new, V1ALPHA1)
    assert old["spec"] == {"text": "konnichiwa", "key": "hello"}
    assert "ja" in old["metadata"]["annotations"]["example.kanri.dev/preserved-v1"]
    old["spec"]["text"] = "ohayou"
    assert GREETINGS.convert(old, V1)["spec"] == {"message": "ohayou", "publish": {"key": "hello"}, "language": "ja"}
