"""Hub-and-spoke conversion: round trips in both directions give back the object unchanged (metadata included),
what a version cannot hold survives in an annotation, and an edit made through the other version wins."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field

from kanri.runtime import KubeModel
from kanri.runtime._conversion import Conversion, ConversionError, Conversions
from kanri.runtime._crd import CustomResource

GROUP = "conv.kanri.dev"
HUB, SPOKE = f"{GROUP}/v2", f"{GROUP}/v1"


class Size(KubeModel):
    value: int
    unit: Literal["cm", "in"] = "cm"


class PetSpecV2(KubeModel):
    name: str
    size: Size | None = None
    tags: list[str] = Field(default_factory=list)


class PetStatusV2(KubeModel):
    phase: str | None = None
    ready_replicas: int | None = None


class PetV2(CustomResource, group=GROUP, version="v2", kind="Pet", plural="pets"):
    spec: PetSpecV2
    status: PetStatusV2 | None = None


class PetSpecV1(KubeModel):
    pet_name: str
    size_cm: int | None = None
    color: str | None = None
    """Dropped in v2: only the annotation keeps it."""


class PetStatusV1(KubeModel):
    state: str | None = None


class PetV1(CustomResource, group=GROUP, version="v1", kind="Pet", plural="pets", storage=False):
    spec: PetSpecV1
    status: PetStatusV1 | None = None


def up(old: PetV1) -> PetV2:
    size = Size(value=old.spec.size_cm) if old.spec.size_cm is not None else None
    status = PetStatusV2(phase=old.status.state) if old.status is not None else None
    return PetV2(spec=PetSpecV2(name=old.spec.pet_name, size=size), status=status)


def down(new: PetV2) -> PetV1:
    size = new.spec.size
    size_cm = size.value if size is not None and size.unit == "cm" else None
    status = PetStatusV1(state=new.status.phase) if new.status is not None else None
    return PetV1(spec=PetSpecV1(pet_name=new.spec.name, size_cm=size_cm), status=status)


PETS = Conversion(PetV2)
PETS.spoke(PetV1, to_hub=up, from_hub=down)
PRESERVED_V1, PRESERVED_V2 = PETS.annotation("v1"), PETS.annotation("v2")

names = st.text(alphabet="abcxyz-", min_size=1, max_size=8)
small = st.integers(min_value=0, max_value=500)
annotation_maps = st.dictionaries(st.sampled_from(["a.io/x", "b.io/y", "note"]), names, max_size=2)


@st.composite
def metadata(draw: st.DrawFn) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": draw(names), "namespace": "ns", "uid": "u-1", "resourceVersion": "7"}
    if extra := draw(annotation_maps):
        meta["annotations"] = extra
    if draw(st.booleans()):
        meta["labels"] = {"app": draw(names)}
    return meta


def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


@st.composite
def hub_objects(draw: st.DrawFn) -> dict[str, Any]:
    size = draw(_optional(st.builds(Size, value=small, unit=st.sampled_from(["cm", "in"]))))
    spec = PetSpecV2(name=draw(names), size=size, tags=draw(st.lists(names, max_size=3)))
    status = draw(_optional(st.builds(PetStatusV2, phase=_optional(names), ready_replicas=_optional(small))))
    pet = PetV2(spec=spec, status=status, metadata=draw(metadata()))
    return pet.model_dump(mode="json", by_alias=True, exclude_none=True)


@st.composite
def spoke_objects(draw: st.DrawFn) -> dict[str, Any]:
    spec = PetSpecV1(pet_name=draw(names), size_cm=draw(_optional(small)), color=draw(_optional(names)))
    status = draw(_optional(st.builds(PetStatusV1, state=_optional(names))))
    pet = PetV1(spec=spec, status=status, metadata=draw(metadata()))
    return pet.model_dump(mode="json", by_alias=True, exclude_none=True)


@settings(max_examples=300, deadline=None)
@given(hub_objects())
def test_hub_to_spoke_and_back_is_unchanged(pet: dict[str, Any]) -> None:
    spoke = PETS.convert(pet, SPOKE)
    assert spoke["apiVersion"] == SPOKE
    assert PETS.convert(spoke, HUB) == pet


@settings(max_examples=300, deadline=None)
@given(spoke_objects())
def test_spoke_to_hub_and_back_is_unchanged(pet: dict[str, Any]) -> None:
    hub = PETS.convert(pet, HUB)
    assert hub["apiVersion"] == HUB
    assert PETS.convert(hub, SPOKE) == pet


@settings(max_examples=200, deadline=None)
@given(hub_objects())
def test_metadata_is_untouched_but_for_the_preservation_annotation(pet: dict[str, Any]) -> None:
    spoke = PETS.convert(pet, SPOKE)
    meta = dict(spoke["metadata"])
    added = dict(meta.pop("annotations", {}))
    added.pop(PRESERVED_V2, None)
    assert {**meta, **({"annotations": added} if added else {})} == pet["metadata"]


def pet_v2(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": HUB, "kind": "Pet", "metadata": {"name": "rex", "namespace": "ns"}, "spec": spec}


def test_a_lossless_conversion_adds_no_annotation() -> None:
    spoke = PETS.convert(pet_v2(name="rex", size={"value": 30, "unit": "cm"}), SPOKE)
    assert spoke == {
        "apiVersion": SPOKE, "kind": "Pet", "metadata": {"name": "rex", "namespace": "ns"},
        "spec": {"petName": "rex", "sizeCm": 30},
    }  # fmt: skip


def test_status_is_converted_too() -> None:
    pet = {**pet_v2(name="rex"), "status": {"phase": "Running", "readyReplicas": 2}}
    spoke = PETS.convert(pet, SPOKE)
    assert spoke["status"] == {"state": "Running"}
    assert PETS.convert(spoke, HUB)["status"] == {"phase": "Running", "readyReplicas": 2}


def test_an_edit_through_the_spoke_wins_and_what_it_cannot_hold_comes_back() -> None:
    spoke = PETS.convert(pet_v2(name="rex", size={"value": 12, "unit": "in"}, tags=["good"]), SPOKE)
    assert spoke["spec"] == {"petName": "rex"}  # inches have no v1 field
    spoke["spec"]["petName"] = "max"
    hub = PETS.convert(spoke, HUB)
    assert hub["spec"] == {"name": "max", "size": {"value": 12, "unit": "in"}, "tags": ["good"]}
    assert "annotations" not in hub["metadata"]


def test_a_value_set_through_the_spoke_replaces_the_preserved_one() -> None:
    spoke = PETS.convert(pet_v2(name="rex", size={"value": 12, "unit": "in"}), SPOKE)
    spoke["spec"]["sizeCm"] = 40
    assert PETS.convert(spoke, HUB)["spec"]["size"] == {"value": 40, "unit": "cm"}


def test_a_field_the_hub_dropped_survives_in_the_stored_object() -> None:
    old = {"apiVersion": SPOKE, "kind": "Pet", "metadata": {"name": "rex"}, "spec": {"petName": "rex", "color": "red"}}
    hub = PETS.convert(old, HUB)
    assert "color" not in str(hub["spec"])
    assert hub["metadata"]["annotations"] == {PRESERVED_V1: '{"spec":{"color":"red","petName":"rex"}}'}
    assert PETS.convert(hub, SPOKE)["spec"] == {"petName": "rex", "color": "red"}


def test_a_damaged_annotation_is_dropped_not_fatal() -> None:
    hub = pet_v2(name="rex")
    hub["metadata"]["annotations"] = {PRESERVED_V1: "{not json"}
    assert PETS.convert(hub, SPOKE)["metadata"] == {"name": "rex", "namespace": "ns"}


def test_an_object_already_in_the_desired_version_is_returned_as_is() -> None:
    assert PETS.convert(pet_v2(name="rex"), HUB) == pet_v2(name="rex")


def test_invalid_objects_and_unknown_versions_raise_conversion_errors_naming_the_problem() -> None:
    with pytest.raises(ConversionError, match=r"invalid as conv.kanri.dev/v2: spec.name: Field required"):
        PETS.convert(pet_v2(), SPOKE)
    with pytest.raises(ConversionError, match=r"Pet has no version 'conv.kanri.dev/v9'"):
        PETS.convert(pet_v2(name="rex"), f"{GROUP}/v9")
    with pytest.raises(ConversionError, match=r"converts no Dog.conv.kanri.dev"):
        Conversions(PETS).convert({**pet_v2(name="rex"), "kind": "Dog"}, SPOKE)


def test_a_spoke_of_another_kind_or_a_repeated_version_is_refused() -> None:
    other = Conversion(PetV2)
    with pytest.raises(ConversionError, match="declared twice"):
        other.spoke(PetV2, to_hub=lambda pet: pet, from_hub=lambda pet: pet)
    with pytest.raises(ConversionError, match="registered twice"):
        Conversions(PETS, other)
    assert PETS.resources == (PetV2, PetV1)
