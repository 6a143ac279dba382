"""Kubernetes' own types as CRD schema, generated from the pinned Kubernetes version's OpenAPI, never hand-written.

``k8s_openapi.json`` (next to this module) holds the OpenAPI v3 definitions of the types below and of everything they
refer to, exactly as the API server of the pinned version serves them. Regenerate it after moving the pin (the
control plane in ``controlplane/``)::

    python -m kanri.runtime._k8s_schemas --kubeconfig PATH      # any API server of the pinned version

``tests/integration/test_runtime_k8s_schemas.py`` fails when the file no longer matches the server's documents.

:func:`structural` turns one definition into a structural CRD schema node (references inlined, ``IntOrString`` and
``Quantity`` as ``x-kubernetes-int-or-string``, free-form objects kept, strategic-merge and union markers dropped,
object defaults dropped). In a model, ``Annotated[dict[str, Any], k8s_schema("io.k8s.api.core.v1.Container")]``; the
common ones have names in :mod:`kanri.runtime.schemas`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from kanri.runtime._model import QUANTITY_PATTERN

if TYPE_CHECKING:
    from kanri.runtime._client import Client

__all__ = ["K8sSchema", "extract", "k8s_schema", "kubernetes_version", "structural"]

FILE = Path(__file__).with_name("k8s_openapi.json")
# The OpenAPI v3 documents (group versions) the definitions come from.
DOCUMENTS = ("api/v1", "apis/batch/v1")
# The types an operator embeds in its own resources; their closure is stored.
ROOTS = (
    "io.k8s.api.core.v1.PodTemplateSpec",
    "io.k8s.api.batch.v1.JobTemplateSpec",
    "io.k8s.api.core.v1.ObjectReference",
)

_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_SPECIAL: dict[str, dict[str, Any]] = {
    _INT_OR_STRING: {"x-kubernetes-int-or-string": True},
    _QUANTITY: {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True,
    },
}
# Formats the API server validates in CRDs (as kanri.runtime._crd keeps them).
_FORMATS = frozenset(
    {"bsonobjectid", "uri", "email", "hostname", "ipv4", "ipv6", "cidr", "mac", "uuid", "uuid3", "uuid4", "uuid5"}
    | {"byte", "password", "date", "date-time", "int32", "int64", "float", "double"}
)
_KEPT = frozenset(
    {"type", "enum", "required", "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type"}
    | {"minimum", "maximum", "minLength", "maxLength", "pattern", "minItems", "maxItems", "x-kubernetes-validations"}
)
# Built-in types' markers a CRD schema cannot carry or has no use for (strategic merge patch, unions, GVKs).
_DROPPED = frozenset(
    {"x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key", "x-kubernetes-unions"}
    | {"x-kubernetes-group-version-kind", "x-kubernetes-selectable-fields", "oneOf", "discriminator"}
)


class K8sSchemaError(ValueError):
    """A definition is missing from the stored file, or has something a CRD schema cannot carry."""


def extract(documents: Iterable[Mapping[str, Any]], roots: Iterable[str] = ROOTS) -> dict[str, Any]:
    """The definitions ``roots`` need (themselves and everything they refer to), from OpenAPI v3 documents as the API
    server serves them under ``/openapi/v3/<group version>``; keys sorted, so the output is stable."""
    available: dict[str, Any] = {}
    for document in documents:
        available.update(document.get("components", {}).get("schemas", {}))
    needed: dict[str, Any] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in needed:
            continue
        if name not in available:
            raise K8sSchemaError(f"{name} is in none of the OpenAPI documents")
        needed[name] = available[name]
        pending.extend(_references(available[name]))
    return {name: needed[name] for name in sorted(needed)}


def _references(node: Any) -> Iterable[str]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value.rpartition("/")[2]
            else:
                yield from _references(value)
    elif isinstance(node, list):
        for item in node:
            yield from _references(item)


@functools.cache
def _stored() -> dict[str, Any]:
    return stored()


def kubernetes_version() -> str:
    """The Kubernetes version (``major.minor``) the stored definitions were generated from."""
    return str(_stored()["kubernetesVersion"])


@functools.cache
def _structural(name: str, descriptions: bool) -> dict[str, Any]:
    definitions: dict[str, Any] = _stored()["definitions"]
    if name not in definitions:
        raise K8sSchemaError(f"{name} is not among the stored Kubernetes definitions (see {FILE.name}'s ROOTS)")
    node = _Converter(definitions, descriptions).convert({"$ref": f"#/components/schemas/{name}"}, (), name)
    description = definitions[name].get("description")
    if description and not descriptions:
        node["description"] = description.split("\n\n")[0]  # the type's summary, for kubectl explain
    return node


def structural(name: str, *, descriptions: bool = False) -> dict[str, Any]:
    """The structural CRD schema of the stored definition ``name`` (``io.k8s.api.core.v1.PodTemplateSpec``).

    Nested field descriptions are left out unless ``descriptions`` (with them a PodTemplateSpec is ~370 kB of CRD,
    without ~80 kB); the type's own summary is kept."""
    copy: dict[str, Any] = json.loads(json.dumps(_structural(name, descriptions)))  # fresh: callers may change it
    return copy


class _Converter:
    def __init__(self, definitions: Mapping[str, Any], descriptions: bool) -> None:
        self.definitions = definitions
        self.descriptions = descriptions

    def convert(
        self,
        node: Mapping[str, Any],
        refs: tuple[str, ...],
        path: str,
        *,
        keys: frozenset[str] = frozenset(),
        key: bool = False,
    ) -> dict[str, Any]:
        """``keys``: the list-map keys when ``node`` is a list-map's item; ``key``: ``node`` is one such key (whose
        zero-value default is kept, a CRD needs list-map keys required or defaulted)."""
        flat, refs = self._inline(node, refs, path)
        if "$ref" in flat:
            return self._special(flat)
        out: dict[str, Any] = {}
        for name, value in flat.items():
            if name in _DROPPED:
                continue
            if name == "description":
                if self.descriptions:
                    out[name] = value
            elif name == "default":
                if _keeps_default(value, flat, key=key):
                    out[name] = value
            elif name == "format":
                if value in _FORMATS:
                    out[name] = value
            elif name in ("properties", "items", "additionalProperties"):
                out.update(self._children(name, value, flat, refs, path, keys))
            elif name in _KEPT:
                out[name] = value
            else:
                raise K8sSchemaError(f"{path}: {name!r} has no place in a CRD schema; extend _KEPT or _DROPPED")
        if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
            out["x-kubernetes-preserve-unknown-fields"] = True  # free-form (FieldsV1, RawExtension): keep it whole
        return out

    def _inline(
        self, node: Mapping[str, Any], refs: tuple[str, ...], path: str
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """``node`` with a lone ``allOf`` and every ``$ref`` merged in (``node``'s own keys win), and the definitions
        it went through added to ``refs``; a ``$ref`` to one of the :data:`_SPECIAL` types stays in place."""
        flat = dict(node)
        while True:
            if "allOf" in flat and len(flat["allOf"]) == 1:
                (inner,) = flat.pop("allOf")
                flat = {**inner, **flat}
            elif "$ref" in flat and (name := _ref_name(flat["$ref"])) not in _SPECIAL:
                if name in refs:
                    raise K8sSchemaError(f"{path}: {name} contains itself; recursive types are not structural")
                refs = (*refs, name)
                del flat["$ref"]
                flat = {**self.definitions[name], **flat}
            else:
                return flat, refs

    def _special(self, flat: Mapping[str, Any]) -> dict[str, Any]:
        """The schema of a :data:`_SPECIAL` type ``flat`` refers to, with ``flat``'s description if asked for."""
        special = dict(_SPECIAL[_ref_name(flat["$ref"])])
        if self.descriptions and flat.get("description"):
            special["description"] = flat["description"]
        return special

    def _children(
        self,
        name: str,
        value: Any,
        flat: Mapping[str, Any],
        refs: tuple[str, ...],
        path: str,
        keys: frozenset[str],
    ) -> dict[str, Any]:
        """``flat``'s ``properties``, ``items`` or ``additionalProperties`` (``name``), converted, as output keys."""
        if name == "properties":
            # A key the item requires needs no default; one it does not must keep even a zero one.
            optional = keys - set(flat.get("required", ()))
            return {
                name: {
                    field: self.convert(child, refs, f"{path}.{field}", key=field in optional)
                    for field, child in sorted(value.items())
                }
            }
        if name == "items":
            map_keys = frozenset(flat.get("x-kubernetes-list-map-keys", ()))
            return {name: self.convert(value, refs, f"{path}[*]", keys=map_keys)}
        if isinstance(value, Mapping) and value:
            return {name: self.convert(value, refs, f"{path}[*]")}
        if value is True or value == {}:
            return {"x-kubernetes-preserve-unknown-fields": True}
        return {}


def _ref_name(ref: object) -> str:
    """The definition a ``$ref`` names (its last path segment)."""
    return str(ref).rpartition("/")[2]


def _keeps_default(value: Any, flat: Mapping[str, Any], *, key: bool) -> bool:
    """Whether a ``default`` goes into the CRD. The server publishes Go zero values as defaults (`{}` on structs,
    `""` on strings): kept, they would fill in required fields before validation (a container without a name would
    pass) and clash with enums. Real defaults (a port's protocol "TCP") are kept, and a list-map key's scalar zero
    value too."""
    zero = value in ("", 0, False, {}, []) and not (key and not isinstance(value, dict | list))
    return not zero and ("enum" not in flat or value in flat["enum"])


@dataclass(frozen=True)
class K8sSchema:
    """Marks a ``dict[str, Any]`` field as a Kubernetes type: its CRD schema is the stored definition's.

    The value stays a raw dict in Python (the operator passes it on unchanged); the API server checks it against
    the schema when the custom resource is written, with the same structure checks (types, enums, required fields,
    list keys) the built-in API applies to the type's own fields. Semantic checks done in Go code are not in the
    schema (the object embedding it is accepted; the child made from it may still be refused: a 422, which the
    runtime reports as a terminal error)."""

    name: str
    descriptions: bool = False

    def __post_init__(self) -> None:
        if self.name not in _stored()["definitions"]:
            raise K8sSchemaError(f"{self.name} is not among the stored Kubernetes definitions")

    def __get_pydantic_json_schema__(self, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return structural(self.name, descriptions=self.descriptions)


def k8s_schema(name: str, *, descriptions: bool = False) -> K8sSchema:
    """The marker for ``Annotated[dict[str, Any], k8s_schema("io.k8s.api.core.v1.Container")]``."""
    return K8sSchema(name, descriptions)


# --- the generator ------------------------------------------------------------------------------------------------


async def from_server(client: Client) -> dict[str, Any]:
    """What the stored file holds, as the API server behind ``client`` serves it (the pinned version's)."""
    version = await client.get_path("/version")
    documents = [await client.get_path(f"/openapi/v3/{document}") for document in DOCUMENTS]
    return {
        "kubernetesVersion": f"{version['major']}.{version['minor']}",
        "documents": list(DOCUMENTS),
        "roots": list(ROOTS),
        "definitions": extract(documents),
    }


def stored() -> dict[str, Any]:
    """The stored file's content."""
    content: dict[str, Any] = json.loads(FILE.read_text())
    return content


async def _generate(kubeconfig: str) -> dict[str, Any]:
    from kanri.runtime._client import Client  # only the generator talks to a server

    async with await Client.from_kubeconfig(kubeconfig) as client:
        return await from_server(client)


def main() -> None:
    """``python -m kanri.runtime._k8s_schemas --kubeconfig PATH``: regenerate the stored file."""
    parser = argparse.ArgumentParser(description=f"Regenerate {FILE.name} from a running API server.")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--output", type=Path, default=FILE)
    args = parser.parse_args()
    content = asyncio.run(_generate(args.kubeconfig))
    args.output.write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
