"""CRD generation: the schema is structural (what the API server demands) and says what the pydantic models say."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal

import pytest
import yaml
from pydantic import Field, ValidationError

from kanri.runtime._crd import CustomResource, PrinterColumn, Scale, SchemaError, crd_for, crd_yaml
from kanri.runtime._model import (
    QUANTITY_PATTERN,
    Conditions,
    IntOrString,
    KubeModel,
    Quantity,
    cel,
    list_map,
    list_set,
    parse_quantity,
)

GROUP = "example.kanri.dev"


class Volume(KubeModel):
    """A data volume."""

    size: Annotated[
        Quantity, cel("quantity(string(self)).compareTo(quantity(string(oldSelf))) >= 0", "size may not shrink")
    ] = "1Gi"
    """Volume size."""
    storage_class: str | None = None
    """StorageClass name."""


class Tier(enum.Enum):
    GOLD = "gold"
    SILVER = "silver"


class WidgetSpec(
    KubeModel, validations=[cel("self.minReplicas <= self.replicas", "minReplicas must not exceed replicas")]
):
    """Desired state of a widget."""

    replicas: Annotated[int, Field(ge=0, le=10)] = 1
    """Number of widgets."""
    min_replicas: int = 0
    mode: Literal["fast", "safe"] = "safe"
    tier: Tier = Tier.GOLD
    image: Annotated[str, Field(min_length=1, pattern=r"^[a-z]+$"), cel("self == oldSelf", "image is immutable")]
    data: Volume = Volume()
    """The main volume."""
    logs: Volume | None = None
    """Optional log volume."""
    ports: Annotated[list[IntOrString], Field(max_length=4)] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    affinity: dict[str, Any] | None = None
    raw: Any = None
    tags: set[str] = Field(default_factory=set)
    zones: Annotated[list[str], list_set()] = Field(default_factory=list)
    ratio: Annotated[float, Field(gt=0, lt=1)] = 0.5
    window: timedelta | None = None
    started: datetime | None = None
    note: str | None
    """Required, but may be null."""
    limit: int | None = 5


class WidgetStatus(KubeModel):
    phase: str | None = None
    conditions: Conditions = Field(default_factory=list)


class Widget(
    CustomResource,
    group=GROUP,
    version="v1alpha1",
    kind="Widget",
    plural="widgets",
    short_names=("wd",),
    categories=("kanri",),
    printer_columns=(
        PrinterColumn("Replicas", ".spec.replicas", type="integer"),
        PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status', description="Ready condition"),
    ),
):
    """A widget, for tests."""

    spec: WidgetSpec
    status: WidgetStatus | None = None


def schema_of(*resources: type[CustomResource]) -> dict[str, Any]:
    root: dict[str, Any] = crd_for(*resources)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every (path, value) pair of a nested JSON value, dict keys included as the last path element."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path}/{key}", value
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}/{index}")


SPEC = schema_of(Widget)["properties"]["spec"]
FIELDS = SPEC["properties"]


# --- structural shape -------------------------------------------------------------------------------------------


def test_refs_are_inlined_and_no_titles_remain() -> None:
    keys = {path.rsplit("/", 1)[1] for path, _ in walk(schema_of(Widget)) if "/default" not in path}
    assert not keys & {"$ref", "$defs", "title", "allOf", "const", "uniqueItems"}


def test_every_node_has_a_type_or_an_explicit_escape() -> None:
    def check(node: dict[str, Any], path: str) -> None:
        escaped = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        assert "type" in node or escaped, path
        for name, child in node.get("properties", {}).items():
            check(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            check(node["items"], f"{path}[*]")
        if isinstance(node.get("additionalProperties"), dict):
            check(node["additionalProperties"], f"{path}[*]")

    check(schema_of(Widget), "")


def test_nested_model_takes_its_docstring_and_the_field_docstring_wins() -> None:
    assert FIELDS["data"]["description"] == "The main volume."
    assert FIELDS["data"]["properties"]["size"]["description"] == "Volume size."
    assert SPEC["description"] == "Desired state of a widget."
    assert FIELDS["replicas"]["description"] == "Number of widgets."


def test_wire_names_are_camel_case() -> None:
    assert {"minReplicas", "storageClass"} <= set(FIELDS) | set(FIELDS["data"]["properties"])


def test_top_level_has_type_meta_strings_and_an_undescribed_metadata() -> None:
    root = schema_of(Widget)
    assert root["type"] == "object"
    assert root["description"] == "A widget, for tests."
    assert root["properties"]["apiVersion"]["type"] == "string"
    assert root["properties"]["kind"]["type"] == "string"
    assert root["properties"]["metadata"] == {"type": "object"}
    assert root["required"] == ["spec"]
    assert "default" not in root["properties"]["apiVersion"]


# --- optional and nullable --------------------------------------------------------------------------------------


def test_optional_with_default_none_is_just_not_required() -> None:
    assert FIELDS["logs"]["type"] == "object"
    assert "nullable" not in FIELDS["logs"]
    assert "default" not in FIELDS["logs"]
    assert FIELDS["logs"]["description"] == "Optional log volume."
    assert "logs" not in SPEC["required"]
    assert "status" not in schema_of(Widget)["required"]


def test_optional_without_a_none_default_is_nullable() -> None:
    assert FIELDS["note"] == {"type": "string", "nullable": True, "description": "Required, but may be null."}
    assert "note" in SPEC["required"]
    assert FIELDS["limit"] == {"type": "integer", "nullable": True, "default": 5}


# --- types ------------------------------------------------------------------------------------------------------


def test_quantity_is_int_or_string_with_the_quantity_pattern_and_no_type() -> None:
    size = FIELDS["data"]["properties"]["size"]
    assert size["x-kubernetes-int-or-string"] is True
    assert size["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert size["pattern"] == QUANTITY_PATTERN
    assert "type" not in size


def test_int_or_string_items_and_plain_int_or_str_unions() -> None:
    assert FIELDS["ports"]["items"] == {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
    }
    assert FIELDS["ports"]["maxItems"] == 4

    class Plain(KubeModel):
        value: int | str = 1

    class Thing(CustomResource, group=GROUP, version="v1", kind="Thing", plural="things"):
        spec: Plain

    assert schema_of(Thing)["properties"]["spec"]["properties"]["value"]["x-kubernetes-int-or-string"] is True


def test_enums_come_from_literal_and_enum_classes() -> None:
    assert FIELDS["mode"] == {"type": "string", "enum": ["fast", "safe"], "default": "safe"}
    assert FIELDS["tier"]["enum"] == ["gold", "silver"]
    assert FIELDS["tier"]["default"] == "gold"


def test_field_constraints_become_openapi_v3_validations() -> None:
    assert FIELDS["replicas"]["minimum"] == 0
    assert FIELDS["replicas"]["maximum"] == 10
    assert FIELDS["image"]["minLength"] == 1
    assert FIELDS["image"]["pattern"] == "^[a-z]+$"
    # JSON schema 2020-12 numeric exclusive bounds become OpenAPI v3's bound + boolean.
    ratio = FIELDS["ratio"]
    assert (ratio["minimum"], ratio["exclusiveMinimum"], ratio["maximum"], ratio["exclusiveMaximum"]) == (
        0,
        True,
        1,
        True,
    )


def test_maps_free_form_objects_and_any() -> None:
    assert FIELDS["labels"] == {"type": "object", "additionalProperties": {"type": "string"}}
    assert FIELDS["affinity"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert FIELDS["raw"] == {"x-kubernetes-preserve-unknown-fields": True}


def test_formats_the_api_server_understands_are_kept_others_dropped() -> None:
    assert FIELDS["started"] == {"type": "string", "format": "date-time"}
    assert FIELDS["window"] == {"type": "string"}, "ISO 8601 durations are not Go durations"


def test_lists_markers_map_and_set() -> None:
    conditions = schema_of(Widget)["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert conditions["items"]["required"] == ["type", "status", "lastTransitionTime", "reason", "message"]
    assert conditions["items"]["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    assert conditions["items"]["properties"]["lastTransitionTime"]["format"] == "date-time"
    assert FIELDS["tags"]["x-kubernetes-list-type"] == "set"
    assert FIELDS["zones"]["x-kubernetes-list-type"] == "set"


# --- CEL --------------------------------------------------------------------------------------------------------


def test_cel_on_a_field_lands_on_that_field() -> None:
    assert FIELDS["image"]["x-kubernetes-validations"] == [{"rule": "self == oldSelf", "message": "image is immutable"}]
    size_rules = FIELDS["data"]["properties"]["size"]["x-kubernetes-validations"]
    assert size_rules == [
        {"rule": "quantity(string(self)).compareTo(quantity(string(oldSelf))) >= 0", "message": "size may not shrink"}
    ]


def test_cel_on_a_model_class_lands_on_the_object() -> None:
    assert SPEC["x-kubernetes-validations"] == [
        {"rule": "self.minReplicas <= self.replicas", "message": "minReplicas must not exceed replicas"}
    ]


def test_cel_rules_of_the_type_and_of_the_field_are_both_kept_and_inherited() -> None:
    class Base(KubeModel, validations=[cel("self.a >= 0", "a must not be negative")]):
        a: int = 0

    class Child(Base, validations=[cel("self.a < 100", "a must be below 100")]):
        pass

    class Spec(KubeModel):
        child: Annotated[Child, cel("self == oldSelf", "child is immutable")] = Child()
        maybe: Annotated[Child | None, cel("has(self.a)", "a is required", reason="FieldValueRequired")] = None

    class Holder(CustomResource, group=GROUP, version="v1", kind="Holder", plural="holders"):
        spec: Spec

    fields = schema_of(Holder)["properties"]["spec"]["properties"]
    assert [rule["message"] for rule in fields["child"]["x-kubernetes-validations"]] == [
        "a must not be negative",
        "a must be below 100",
        "child is immutable",
    ]
    assert fields["maybe"]["x-kubernetes-validations"][-1] == {
        "rule": "has(self.a)",
        "message": "a is required",
        "reason": "FieldValueRequired",
    }
    assert "nullable" not in fields["maybe"]


def test_cel_rule_carries_every_option_in_camel_case() -> None:
    rule = cel(
        "self.x == oldSelf.x",
        message_expression="'x changed to ' + self.x",
        reason="FieldValueForbidden",
        field_path=".x",
        optional_old_self=True,
    )
    assert rule.to_schema() == {
        "rule": "self.x == oldSelf.x",
        "messageExpression": "'x changed to ' + self.x",
        "reason": "FieldValueForbidden",
        "fieldPath": ".x",
        "optionalOldSelf": True,
    }


@pytest.mark.parametrize(
    "arguments",
    [{"rule": " "}, {"rule": "true", "message": "two\nlines"}, {"rule": "true", "reason": "Nope"}],
    ids=["empty-rule", "multi-line-message", "unknown-reason"],
)
def test_cel_refuses_what_the_api_server_would_refuse(arguments: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="CEL"):
        cel(**arguments)


def test_resource_level_rules_land_on_the_root() -> None:
    class Named(
        CustomResource,
        group=GROUP,
        version="v1",
        kind="Named",
        plural="nameds",
        validations=[cel("self.metadata.name.size() <= 20", "name too long")],
    ):
        spec: Volume

    assert schema_of(Named)["x-kubernetes-validations"] == [
        {"rule": "self.metadata.name.size() <= 20", "message": "name too long"}
    ]


# --- defaults ---------------------------------------------------------------------------------------------------


def test_defaults_are_emitted_by_wire_name_and_without_nulls() -> None:
    assert FIELDS["replicas"]["default"] == 1
    assert FIELDS["data"]["default"] == {"size": "1Gi"}, "storageClass=None is absence, not a null"
    assert FIELDS["data"]["properties"]["size"]["default"] == "1Gi"


def test_default_factories_are_not_emitted() -> None:
    for name in ("ports", "labels", "tags", "zones"):
        assert "default" not in FIELDS[name], name


def test_nested_defaults_keep_nulls_where_the_schema_allows_them() -> None:
    class Inner(KubeModel):
        kept: int | None = 3
        dropped: str | None = None

    class Outer(KubeModel):
        inner: Inner = Inner(kept=None)

    class Holder(CustomResource, group=GROUP, version="v1", kind="Holder", plural="holders"):
        spec: Outer

    assert schema_of(Holder)["properties"]["spec"]["properties"]["inner"]["default"] == {"kept": None}


# --- versions, names, subresources, columns ---------------------------------------------------------------------


def test_names_scope_and_version_entry() -> None:
    crd = crd_for(Widget)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"] == {"name": "widgets.example.kanri.dev"}
    assert crd["spec"]["group"] == GROUP
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"] == {
        "kind": "Widget",
        "listKind": "WidgetList",
        "plural": "widgets",
        "singular": "widget",
        "shortNames": ["wd"],
        "categories": ["kanri"],
    }
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert Widget.resource.api_version == "example.kanri.dev/v1alpha1"


def test_printer_columns_take_field_descriptions_and_keep_age() -> None:
    (version,) = crd_for(Widget)["spec"]["versions"]
    assert version["additionalPrinterColumns"] == [
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas", "description": "Number of widgets."},
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
            "description": "Ready condition",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def test_an_explicit_age_column_is_not_duplicated_and_options_are_emitted() -> None:
    class Aged(
        CustomResource,
        group=GROUP,
        version="v1",
        kind="Aged",
        plural="ageds",
        printer_columns=[
            PrinterColumn("Created", ".metadata.creationTimestamp", type="date", priority=1),
            PrinterColumn("Size", ".spec.size", format="byte"),
        ],
    ):
        spec: Volume

    (version,) = crd_for(Aged)["spec"]["versions"]
    assert version["additionalPrinterColumns"] == [
        {"name": "Created", "type": "date", "jsonPath": ".metadata.creationTimestamp", "priority": 1},
        {"name": "Size", "type": "string", "jsonPath": ".spec.size", "format": "byte", "description": "Volume size."},
    ]


def test_status_subresource_follows_the_status_field_unless_told() -> None:
    class NoStatus(CustomResource, group=GROUP, version="v1", kind="NoStatus", plural="nostatuses"):
        spec: Volume

    class Forced(
        CustomResource,
        group=GROUP,
        version="v1",
        kind="Forced",
        plural="forceds",
        status_subresource=False,
        scale=Scale(label_selector_path=".status.selector"),
    ):
        spec: Volume
        status: WidgetStatus | None = None

    assert crd_for(Widget)["spec"]["versions"][0]["subresources"] == {"status": {}}
    assert "subresources" not in crd_for(NoStatus)["spec"]["versions"][0]
    assert crd_for(Forced)["spec"]["versions"][0]["subresources"] == {
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    }


def test_several_versions_of_one_kind_share_a_crd_with_one_storage_version() -> None:
    class GadgetV1(CustomResource, group=GROUP, version="v1", kind="Gadget", plural="gadgets"):
        spec: Volume

    class GadgetV2(CustomResource, group=GROUP, version="v2", kind="Gadget", plural="gadgets", storage=False):
        spec: WidgetSpec

    versions = crd_for(GadgetV1, GadgetV2)["spec"]["versions"]
    assert [(v["name"], v["storage"]) for v in versions] == [("v1", True), ("v2", False)]
    assert "replicas" in versions[1]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    with pytest.raises(SchemaError, match="storage"):
        crd_for(GadgetV2)
    with pytest.raises(SchemaError, match="duplicate versions"):
        crd_for(GadgetV1, GadgetV1)
    with pytest.raises(SchemaError, match="must agree"):
        crd_for(GadgetV1, Widget)


# --- determinism ------------------------------------------------------------------------------------------------


def test_output_is_deterministic_with_sorted_keys() -> None:
    assert crd_yaml(Widget) == crd_yaml(Widget)
    crd = crd_for(Widget)
    for path, value in [("", crd), *walk(crd)]:
        if isinstance(value, dict) and "/default" not in path:
            assert list(value) == sorted(value), path


def test_yaml_has_no_aliases_and_round_trips() -> None:
    class Twice(KubeModel):
        first: Volume = Volume()
        second: Volume = Volume()

    class Pair(CustomResource, group=GROUP, version="v1", kind="Pair", plural="pairs"):
        spec: Twice

    text = crd_yaml(Pair)
    assert not re.search(r"[&*]id\d+", text)
    assert yaml.safe_load(text) == crd_for(Pair)
    assert text.startswith("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n")


# --- what a structural schema cannot say ------------------------------------------------------------------------


class A(KubeModel):
    a: int = 0


class B(KubeModel):
    b: str = ""


class Node(KubeModel):
    children: list[Node] = Field(default_factory=list)


class WithUnion(KubeModel):
    either: A | B = A()


class WithTuple(KubeModel):
    pair: tuple[int, str] = (1, "a")


class WithRecursion(KubeModel):
    root: Node = Node()


class WithSetOfObjects(KubeModel):
    items: Annotated[list[A], list_set()] = Field(default_factory=list)


class WithBadMapKey(KubeModel):
    items: Annotated[list[B], list_map("missing")] = Field(default_factory=list)


class WithOptionalMapKey(KubeModel):
    items: Annotated[list[Volume], list_map("storageClass")] = Field(default_factory=list)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (WithUnion, "union"),
        (WithTuple, "prefixItems"),
        (WithRecursion, "recursive"),
        (WithSetOfObjects, "scalars only"),
        (WithBadMapKey, "missing"),
        (WithOptionalMapKey, "required or have a default"),
    ],
)
def test_unstructural_models_are_refused_with_the_field_path(spec: type[KubeModel], message: str) -> None:
    class Bad(CustomResource, group=GROUP, version="v1", kind="Bad", plural="bads"):
        spec: spec  # type: ignore[valid-type]

    with pytest.raises(SchemaError, match=message) as refused:
        crd_for(Bad)
    assert ".spec." in str(refused.value)


def test_incomplete_or_invalid_declarations_fail_at_class_creation() -> None:
    with pytest.raises(SchemaError, match="missing"):

        class Half(CustomResource, group=GROUP, version="v1"):
            spec: Volume

    with pytest.raises(SchemaError, match="at least one dot"):

        class NoDot(CustomResource, group="example", version="v1", kind="NoDot", plural="nodots"):
            spec: Volume

    with pytest.raises(SchemaError, match="plural"):

        class Upper(CustomResource, group=GROUP, version="v1", kind="Upper", plural="Uppers"):
            spec: Volume

    with pytest.raises(SchemaError, match="its own coordinates"):

        class Derived(Widget):
            pass


def test_an_abstract_base_is_not_a_resource() -> None:
    class Base(CustomResource):
        spec: Volume

    class Concrete(Base, group=GROUP, version="v1", kind="Concrete", plural="concretes"):
        pass

    with pytest.raises(SchemaError, match="declares no resource"):
        crd_for(Base)
    assert "size" in schema_of(Concrete)["properties"]["spec"]["properties"]


# --- the models themselves --------------------------------------------------------------------------------------


def test_resource_model_fills_and_checks_type_meta_and_dumps_camel_case() -> None:
    widget = Widget(spec=WidgetSpec(image="web", note=None, min_replicas=0))
    dumped = widget.model_dump(mode="json")
    assert dumped["apiVersion"] == "example.kanri.dev/v1alpha1"
    assert dumped["kind"] == "Widget"
    assert dumped["spec"]["minReplicas"] == 0
    assert Widget.model_validate(dumped) == widget
    with pytest.raises(ValidationError, match="kind"):
        Widget.model_validate({**dumped, "kind": "Gadget"})


def test_models_refuse_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="extra"):
        Volume.model_validate({"size": "1Gi", "sizee": "2Gi"})


# --- quantities -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", Decimal(2**30)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("20000Mi", Decimal(20000 * 2**20)),
        ("500m", Decimal("0.5")),
        ("100n", Decimal("1E-7")),
        ("2k", Decimal(2000)),
        ("1E", Decimal(10**18)),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("-1.5", Decimal("-1.5")),
        (".5", Decimal("0.5")),
        ("+7Ki", Decimal(7168)),
        ("10", Decimal(10)),
    ],
)
def test_parse_quantity_gives_exact_values(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value
    assert re.fullmatch(QUANTITY_PATTERN.strip("^$"), text), "the schema pattern accepts what the parser accepts"


@pytest.mark.parametrize("text", ["", "lots", "1K", "1GiB", "1.2.3", "Gi", "1 Gi", "1e", "1Gi\n", "\u0661"])
def test_parse_quantity_refuses_what_the_api_server_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)
    assert not re.fullmatch(QUANTITY_PATTERN.strip("^$"), text, flags=re.ASCII)


def test_quantity_fields_accept_numbers_and_compare_across_units() -> None:
    assert Volume.model_validate({"size": 1073741824}).size == "1073741824"
    assert parse_quantity(Volume(size="1Gi").size) == parse_quantity(1073741824)
    assert parse_quantity("19Gi") < parse_quantity("20000Mi")
    with pytest.raises(ValidationError, match="not a quantity"):
        Volume(size="big")
    with pytest.raises(ValidationError):
        Volume.model_validate({"size": True})
