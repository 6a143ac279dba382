"""CustomResourceDefinitions generated from pydantic models.

A resource is declared with class keywords (checked by mypy, validated once when the class is created)::

    class Widget(CustomResource, group="example.kanri.dev", version="v1alpha1", kind="Widget", plural="widgets"):
        spec: WidgetSpec
        status: WidgetStatus | None = None

``crd_for(Widget)`` returns the ``apiextensions.k8s.io/v1`` CustomResourceDefinition as a dict, ``crd_yaml(Widget)``
as YAML. The schema is pydantic's JSON schema rewritten into the *structural* subset the API server requires (see
``_Structural``); whatever cannot be expressed there raises :class:`SchemaError` naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field, model_validator

from kanri.runtime._kinds import Kind
from kanri.runtime._model import KubeModel, Rule

__all__ = ["CustomResource", "PrinterColumn", "ResourceInfo", "Scale", "SchemaError", "crd_for", "crd_yaml"]

Scope = Literal["Namespaced", "Cluster"]
ColumnType = Literal["integer", "number", "string", "boolean", "date"]

_GROUP = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+")
_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_KIND = re.compile(r"[A-Z][A-Za-z0-9]*")
_AGE_PATH = ".metadata.creationTimestamp"


class SchemaError(ValueError):
    """A model (or resource declaration) cannot be expressed as a structural CRD."""


@dataclass(frozen=True)
class PrinterColumn:
    """A column of ``kubectl get`` (``additionalPrinterColumns``).

    ``json_path`` is a simple JSONPath such as ``.status.phase`` or ``.status.conditions[?(@.type=="Ready")].status``.
    Without a description, the description of the field the path names is used. Lower ``priority`` shows first;
    columns with priority > 0 appear only with ``-o wide``.
    """

    name: str
    json_path: str
    type: ColumnType = "string"
    description: str | None = None
    priority: int = 0
    format: str | None = None

    def __post_init__(self) -> None:
        if not self.json_path.startswith("."):
            raise SchemaError(f"printer column {self.name!r}: json_path must start with '.', got {self.json_path!r}")


@dataclass(frozen=True)
class Scale:
    """The ``scale`` subresource (``kubectl scale``, HorizontalPodAutoscaler): where the replica counts live."""

    spec_replicas_path: str = ".spec.replicas"
    status_replicas_path: str = ".status.replicas"
    label_selector_path: str | None = None


@dataclass(frozen=True)
class ResourceInfo:
    """What a :class:`CustomResource` subclass declared: its API coordinates and CRD options."""

    group: str
    version: str
    kind: str
    plural: str
    singular: str
    scope: Scope
    short_names: tuple[str, ...]
    categories: tuple[str, ...]
    printer_columns: tuple[PrinterColumn, ...]
    status_subresource: bool | None
    scale: Scale | None
    served: bool
    storage: bool
    deprecated: bool = False
    deprecation_warning: str | None = None

    @property
    def api_version(self) -> str:
        """``group/version``, the ``apiVersion`` of objects of this kind."""
        return f"{self.group}/{self.version}"

    @property
    def crd_name(self) -> str:
        """``plural.group``, the name of the CustomResourceDefinition."""
        return f"{self.plural}.{self.group}"

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def api_kind(self) -> Kind:
        """The :class:`Kind` the client, cache and controllers use for objects of this resource."""
        return Kind(self.api_version, self.kind, self.plural, namespaced=self.scope == "Namespaced")

    def __post_init__(self) -> None:
        # Refuse names the API server would refuse, at class creation rather than at install time.
        problems = []
        if not _GROUP.fullmatch(self.group):
            problems.append(f"group {self.group!r} must be a lowercase DNS name with at least one dot")
        for what, name in [("version", self.version), ("plural", self.plural), ("singular", self.singular)]:
            if not _LABEL.fullmatch(name):
                problems.append(f"{what} {name!r} must be a lowercase DNS-1035 label")
        problems += [
            f"short name {s!r} must be a lowercase DNS-1035 label" for s in self.short_names if not _LABEL.fullmatch(s)
        ]
        problems += [
            f"category {c!r} must be a lowercase DNS-1035 label" for c in self.categories if not _LABEL.fullmatch(c)
        ]
        if not _KIND.fullmatch(self.kind):
            problems.append(f"kind {self.kind!r} must be CamelCase letters and digits")
        if self.scope not in ("Namespaced", "Cluster"):
            problems.append(f"scope must be Namespaced or Cluster, not {self.scope!r}")
        if problems:
            raise SchemaError(f"{self.kind}: " + "; ".join(problems))


class CustomResource(KubeModel):
    """Base of a custom resource kind: subclass it with the class keywords below and fields ``spec`` / ``status``.

    Keywords: ``group``, ``version``, ``kind``, ``plural`` (required together); ``singular`` (default: kind in lower
    case), ``short_names``, ``categories``, ``scope`` (``"Namespaced"`` or ``"Cluster"``), ``printer_columns``,
    ``status_subresource`` (default: on when the model has a ``status`` field), ``scale`` (a :class:`Scale`),
    ``served`` / ``storage`` (for several versions of one kind), ``deprecated`` / ``deprecation_warning`` (the API
    server then sends that warning to every client using the version) and ``validations`` (CEL rules on the whole
    object).
    A subclass without them is an abstract base for other resources. The declaration is ``Cls.resource``.

    ``apiVersion`` and ``kind`` default to the declared ones and are checked on validation; ``metadata`` stays a
    plain dict (the runtime works on raw objects; the model is for the schema and for typed access where wanted).
    """

    resource: ClassVar[ResourceInfo]

    api_version: str = ""
    kind: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)

    def __init_subclass__(
        cls,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        short_names: Sequence[str] = (),
        categories: Sequence[str] = (),
        scope: Scope = "Namespaced",
        printer_columns: Sequence[PrinterColumn] = (),
        status_subresource: bool | None = None,
        scale: Scale | None = None,
        served: bool = True,
        storage: bool = True,
        deprecated: bool = False,
        deprecation_warning: str | None = None,
        validations: Sequence[Rule] = (),
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(validations=validations, **kwargs)
        if group is None or version is None or kind is None or plural is None:
            coordinates = {"group": group, "version": version, "kind": kind, "plural": plural}
            missing = [name for name, value in coordinates.items() if value is None]
            if len(missing) < len(coordinates):
                raise SchemaError(
                    f"{cls.__name__}: a resource declares group, version, kind and plural; missing {missing}"
                )
            if getattr(cls, "resource", None) is not None:
                raise SchemaError(f"{cls.__name__} extends a declared resource, so it must declare its own coordinates")
            return  # an abstract base for resources
        cls.resource = ResourceInfo(
            group=group,
            version=version,
            kind=kind,
            plural=plural,
            singular=singular or kind.lower(),
            scope=scope,
            short_names=tuple(short_names),
            categories=tuple(categories),
            printer_columns=tuple(printer_columns),
            status_subresource=status_subresource,
            scale=scale,
            served=served,
            storage=storage,
            deprecated=deprecated or deprecation_warning is not None,
            deprecation_warning=deprecation_warning,
        )

    @model_validator(mode="before")
    @classmethod
    def _fill_type_meta(cls, data: Any) -> Any:
        info: ResourceInfo | None = getattr(cls, "resource", None)
        if info is None or not isinstance(data, Mapping):
            return data
        data = dict(data)
        for alias, name, expected in [("apiVersion", "api_version", info.api_version), ("kind", "kind", info.kind)]:
            given = data.get(alias, data.get(name))
            if given is None:
                data[alias] = expected
            elif given != expected:
                raise ValueError(f"{alias} is {given!r}, expected {expected!r} for {cls.__name__}")
        return data


def crd_for(*resources: type[CustomResource], webhook: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The CustomResourceDefinition (``apiextensions.k8s.io/v1``) serving ``resources``: one entry in
    ``spec.versions`` per resource class, all of the same kind; exactly one may be the storage version.

    ``webhook`` is the ``clientConfig`` of a conversion webhook (``{"service": {"name", "namespace", "path"}}`` in a
    cluster, ``{"url": ...}`` outside one, with or without ``caBundle``): versions then convert through it
    (``strategy: Webhook``) instead of only changing ``apiVersion`` (``strategy: None``).

    Output is deterministic: keys are sorted at every level (as controller-gen does), lists keep their order.
    """
    if not resources:
        raise SchemaError("crd_for needs at least one resource class")
    infos = [_info(resource) for resource in resources]
    first = infos[0]
    for info in infos[1:]:
        same = (info.group, info.kind, info.plural, info.singular, info.scope, info.short_names, info.categories)
        if same != (
            first.group,
            first.kind,
            first.plural,
            first.singular,
            first.scope,
            first.short_names,
            first.categories,
        ):
            raise SchemaError(f"versions of one CRD must agree on group, names and scope: {first} vs {info}")
    versions = [info.version for info in infos]
    if len(set(versions)) != len(versions):
        raise SchemaError(f"{first.kind}: duplicate versions {versions}")
    if sum(info.storage for info in infos) != 1:
        raise SchemaError(f"{first.kind}: exactly one version must be the storage version (storage=True)")

    names: dict[str, Any] = {
        "kind": first.kind,
        "listKind": first.list_kind,
        "plural": first.plural,
        "singular": first.singular,
    }
    if first.short_names:
        names["shortNames"] = list(first.short_names)
    if first.categories:
        names["categories"] = list(first.categories)
    spec: dict[str, Any] = {
        "group": first.group,
        "names": names,
        "scope": first.scope,
        "versions": [_version(resource, info) for resource, info in zip(resources, infos, strict=True)],
    }
    if webhook is not None:
        conversion = {"clientConfig": dict(webhook), "conversionReviewVersions": ["v1"]}
        spec["conversion"] = {"strategy": "Webhook", "webhook": conversion}
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": first.crd_name},
        "spec": spec,
    }
    sorted_crd: dict[str, Any] = _sorted(crd)
    return sorted_crd


def crd_yaml(*resources: type[CustomResource], webhook: Mapping[str, Any] | None = None) -> str:
    """:func:`crd_for` as a YAML document (stable text, suitable for committing under ``deploy/``)."""
    crd = crd_for(*resources, webhook=webhook)
    return yaml.dump(crd, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=120)


class _Dumper(yaml.SafeDumper):
    """SafeDumper without anchors/aliases, writing multi-line strings (descriptions) as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _info(resource: type[CustomResource]) -> ResourceInfo:
    info: ResourceInfo | None = getattr(resource, "resource", None)
    if info is None:
        raise SchemaError(f"{resource.__name__} declares no resource (group=, version=, kind=, plural=)")
    return info


def _version(resource: type[CustomResource], info: ResourceInfo) -> dict[str, Any]:
    schema = _openapi_schema(resource)
    entry: dict[str, Any] = {
        "name": info.version,
        "served": info.served,
        "storage": info.storage,
        "schema": {"openAPIV3Schema": schema},
    }
    if info.deprecated:
        entry["deprecated"] = True
    if info.deprecation_warning is not None:
        entry["deprecationWarning"] = info.deprecation_warning
    subresources: dict[str, Any] = {}
    status = info.status_subresource
    if status is None:
        status = "status" in resource.model_fields
    if status:
        subresources["status"] = {}
    if info.scale is not None:
        scale = {
            "specReplicasPath": info.scale.spec_replicas_path,
            "statusReplicasPath": info.scale.status_replicas_path,
        }
        if info.scale.label_selector_path:
            scale["labelSelectorPath"] = info.scale.label_selector_path
        subresources["scale"] = scale
    if subresources:
        entry["subresources"] = subresources
    if info.printer_columns:
        entry["additionalPrinterColumns"] = _columns(info.printer_columns, schema)
    return entry


def _columns(columns: Sequence[PrinterColumn], schema: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for column in columns:
        entry: dict[str, Any] = {"name": column.name, "type": column.type, "jsonPath": column.json_path}
        description = column.description or _description_at(schema, column.json_path)
        if description:
            entry["description"] = description
        if column.priority:
            entry["priority"] = column.priority
        if column.format:
            entry["format"] = column.format
        out.append(entry)
    # Declaring any column drops the API server's implicit Age column; keep it, as users expect it last.
    if not any(column.json_path == _AGE_PATH for column in columns):
        out.append({"name": "Age", "type": "date", "jsonPath": _AGE_PATH})
    return out


def _description_at(schema: Mapping[str, Any], json_path: str) -> str | None:
    """The description of the field a simple path (``.status.phase``) names; None for paths with filters."""
    node: Mapping[str, Any] = schema
    for part in json_path.lstrip(".").split("."):
        node = node.get("properties", {}).get(part, {})
    description = node.get("description")
    return description.splitlines()[0] if isinstance(description, str) else None


# --- structural schema ------------------------------------------------------------------------------------------

_TYPE_META = {
    "apiVersion": {
        "type": "string",
        "description": "APIVersion defines the versioned schema of this representation of an object.",
    },
    "kind": {
        "type": "string",
        "description": "Kind is a string value representing the REST resource this object represents.",
    },
    # The API server validates metadata itself; a CRD may not describe it beyond name/generateName.
    "metadata": {"type": "object"},
}

# Formats the API server validates (apiextensions-apiserver formats.go) plus the OpenAPI numeric ones. Others are
# dropped: e.g. pydantic's `duration` is ISO 8601 ("PT1H") while the server's is Go's ("1h").
_FORMATS = frozenset(
    {"bsonobjectid", "uri", "email", "hostname", "ipv4", "ipv6", "cidr", "mac", "uuid", "uuid3", "uuid4", "uuid5"}
    | {"byte", "password", "date", "date-time", "int32", "int64", "float", "double"}
)
# JSON schema keys pydantic may emit that a CRD schema has no use for.
_DROPPED = frozenset({"title", "examples", "readOnly", "writeOnly", "deprecated"})
# Everything a structural CRD schema node may carry after conversion.
_ALLOWED = frozenset(
    {"type", "description", "format", "default", "nullable", "enum", "example", "properties", "required", "items"}
    | {"additionalProperties", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
    | {"minLength", "maxLength", "pattern", "minItems", "maxItems", "minProperties", "maxProperties", "anyOf"}
    | {"x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type"}
    | {"x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource"}
)
_NULL = {"type": "null"}
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def _openapi_schema(resource: type[CustomResource]) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of a resource: its JSON schema made structural, with Kubernetes' type meta."""
    raw = resource.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema = _Structural(defs).convert(raw, path="", refs=())
    properties = schema.setdefault("properties", {})
    properties.update({name: dict(node) for name, node in _TYPE_META.items()})
    required = [name for name in schema.get("required", []) if name not in _TYPE_META]
    if required:
        schema["required"] = required
    else:
        schema.pop("required", None)
    return schema


def _merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overlay``'s keys on top; CEL rules from both are kept (the type's first, then the field's)."""
    merged = dict(base)
    for key, value in overlay.items():
        if key == "x-kubernetes-validations":
            merged[key] = [*base.get(key, []), *value]
        else:
            merged[key] = value
    return merged


class _Structural:
    """Rewrites pydantic's JSON schema into a structural CRD schema.

    Rules:
    - ``$ref`` is inlined (the field's description, default and CEL rules overlay the referenced model's);
      a model that contains itself is refused (a structural schema is a finite tree).
    - ``X | None``: with default None the field is just optional (absent means None, so it is not ``nullable``);
      otherwise (required, or another default) it is ``X`` with ``nullable: true``. A ``default: null`` is dropped.
    - ``int | str`` becomes ``x-kubernetes-int-or-string``; any other union is refused.
    - ``title`` and other annotation-only keys are dropped; ``const`` becomes a one-value ``enum``; numeric
      ``exclusiveMinimum``/``exclusiveMaximum`` (JSON schema 2020-12) become OpenAPI v3 ``minimum`` + boolean.
    - ``set[X]`` (``uniqueItems``, forbidden in CRDs) becomes ``x-kubernetes-list-type: set``.
    - ``dict[str, Any]`` and ``Any`` keep unknown fields (``x-kubernetes-preserve-unknown-fields``);
      ``additionalProperties: false`` (``extra="forbid"``) is dropped — pruning already removes unknown fields.
    - defaults are pruned of nulls the schema does not allow (a nested model's None fields).
    - anything else a CRD cannot carry raises :class:`SchemaError` with the field's path.
    """

    def __init__(self, defs: Mapping[str, Any]) -> None:
        self.defs = defs

    def convert(self, node: Mapping[str, Any], *, path: str, refs: tuple[str, ...]) -> dict[str, Any]:
        flat, refs = self._flatten(node, path, refs)
        out: dict[str, Any] = {}
        for key, value in flat.items():
            if key in _DROPPED or (key == "default" and value is None):
                continue
            if key == "const":
                out["enum"] = [value]
            elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
            elif key == "uniqueItems":
                if value:
                    out.setdefault("x-kubernetes-list-type", "set")
            elif key == "format":
                if value in _FORMATS:
                    out[key] = value
            elif key == "properties":
                out[key] = {
                    name: self.convert(child, path=f"{path}.{name}", refs=refs) for name, child in value.items()
                }
            elif key == "items":
                if not isinstance(value, Mapping):
                    raise SchemaError(f"{path or '<root>'}: tuple-like items cannot be expressed in a CRD schema")
                out[key] = self.convert(value, path=f"{path}[*]", refs=refs)
            elif key == "additionalProperties":
                if isinstance(value, Mapping) and value:
                    out[key] = self.convert(value, path=f"{path}[*]", refs=refs)
                elif value is True or value == {}:
                    out["x-kubernetes-preserve-unknown-fields"] = True
                # `false` (extra="forbid") says nothing pruning does not already do.
            elif key in _ALLOWED:
                out[key] = value
            else:
                raise SchemaError(f"{path or '<root>'}: {key!r} cannot be expressed in a CRD schema")
        self._settle(out, path)
        if "default" in out:
            out["default"] = _prune(out["default"], out)
        return out

    def _flatten(
        self, node: Mapping[str, Any], path: str, refs: tuple[str, ...]
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Resolve ``$ref``, single ``allOf`` and ``X | None`` until the node is one plain schema."""
        flat = dict(node)
        while True:
            if "$ref" in flat:
                name = str(flat.pop("$ref")).rpartition("/")[2]
                if name in refs:
                    raise SchemaError(f"{path or '<root>'}: {name} contains itself; recursive types are not structural")
                refs = (*refs, name)
                flat = _merge(self.defs[name], flat)
            elif "allOf" in flat and len(flat["allOf"]) == 1:
                (inner,) = flat.pop("allOf")
                flat = _merge(inner, flat)
            elif "anyOf" in flat and not flat.get("x-kubernetes-int-or-string"):
                branches = flat.pop("anyOf")
                others = [branch for branch in branches if branch != _NULL]
                if len(others) < len(branches):
                    if flat.get("default", ...) is None:
                        del flat["default"]  # absent means None: plain optional field
                    else:
                        flat["nullable"] = True
                if len(others) == 1:
                    flat = _merge(others[0], flat)
                elif sorted(others, key=lambda branch: str(branch)) == _INT_OR_STRING:
                    flat.update({"anyOf": list(_INT_OR_STRING), "x-kubernetes-int-or-string": True})
                    return flat, refs
                else:
                    raise SchemaError(
                        f"{path or '<root>'}: a union of {len(others)} types has no structural schema "
                        "(only `X | None` and `int | str` do); use one model with optional fields instead"
                    )
            else:
                return flat, refs

    @staticmethod
    def _settle(node: dict[str, Any], path: str) -> None:
        """Give every node a type (or an explicit escape) and check the list markers against the items."""
        where = path or "<root>"
        kind = node.get("type")
        if node.get("x-kubernetes-preserve-unknown-fields") and kind is None and "properties" in node:
            node["type"] = "object"
        elif kind is None and not node.get("x-kubernetes-int-or-string"):
            if "enum" in node or "properties" in node or "items" in node:
                raise SchemaError(f"{where}: values of mixed types have no structural schema")
            node["x-kubernetes-preserve-unknown-fields"] = True  # `Any`: keep whatever is sent
        elif kind == "null":
            raise SchemaError(f"{where}: a field that can only be None has no structural schema")
        elif kind == "object" and "additionalProperties" in node and "properties" in node:
            raise SchemaError(f"{where}: a model with typed extra fields has no structural schema")
        list_type = node.get("x-kubernetes-list-type")
        if list_type is not None and kind != "array":
            raise SchemaError(f"{where}: list_map/list_set apply to lists only")
        items = node.get("items", {})
        if list_type == "set" and items.get("type") in ("object", "array"):
            raise SchemaError(f"{where}: a set holds scalars only; for objects use list_map(key, ...)")
        if list_type == "map":
            properties = items.get("properties", {})
            required = set(items.get("required", []))
            for key in node.get("x-kubernetes-list-map-keys", []):
                field = properties.get(key)
                if field is None or field.get("type") in ("object", "array") or field.get("nullable"):
                    raise SchemaError(f"{where}: list map key {key!r} must be a non-nullable scalar field of the items")
                if key not in required and "default" not in field:
                    raise SchemaError(f"{where}: list map key {key!r} must be required or have a default")


def _prune(value: Any, schema: Mapping[str, Any]) -> Any:
    """Drop nulls the schema does not allow from a default (pydantic writes a nested model's None fields)."""
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        pruned = {}
        for key, item in value.items():
            child = properties.get(key, {}) if properties is not None else extra if isinstance(extra, Mapping) else {}
            if item is None and not child.get("nullable"):
                continue
            pruned[key] = _prune(item, child)
        return pruned
    if isinstance(value, list):
        items = schema.get("items", {})
        return [_prune(item, items) for item in value]
    return value


def _sorted(value: Any) -> Any:
    """A deep copy with dict keys sorted at every level, so equal inputs give byte-equal YAML."""
    if isinstance(value, Mapping):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value
