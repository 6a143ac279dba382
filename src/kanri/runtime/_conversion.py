"""Conversion between the versions of a custom resource kind: one hub version, spokes that convert to and from it.

controller-runtime's model: every version converts to and from one *hub* (usually the storage version), so n
versions need 2(n-1) functions, not n(n-1). A spoke is declared with two plain functions on the pydantic types::

    greetings = Conversion(GreetingV1)                      # the hub
    greetings.spoke(GreetingV1Alpha1, to_hub=up, from_hub=down)

What one version cannot hold survives a round trip through another in an annotation (as Cluster API's
``conversion-data``): converting *away* from a version that would lose something stores that version's body under
``<group>/preserved-<version>``; converting *back* restores from it what the round trip lost, while what the user
changed through the other version wins. Metadata is copied untouched apart from those annotations (the API server
refuses any other metadata change from a conversion webhook anyway).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog
from pydantic import ValidationError

from kanri.runtime._crd import CustomResource

__all__ = ["Conversion", "ConversionError", "Conversions"]

log = structlog.get_logger("kanri.conversion")

H = TypeVar("H", bound=CustomResource)
S = TypeVar("S", bound=CustomResource)
Obj = dict[str, Any]

_TYPE_META = ("apiVersion", "kind", "metadata")
_MISSING: Any = object()


class ConversionError(ValueError):
    """An object could not be converted: unknown kind or version, or invalid in its own version."""


@dataclass(frozen=True)
class _Spoke:
    model: type[CustomResource]
    to_hub: Callable[[Any], CustomResource]
    from_hub: Callable[[Any], CustomResource]


class Conversion(Generic[H]):
    """The versions of one kind: the hub model and its spokes, each with ``to_hub`` / ``from_hub``.

    The functions receive a validated model and return a model of the other version; they need not copy
    ``metadata`` (it is copied for them). ``preserve_prefix`` is the annotation prefix for data a version cannot hold
    (default: the kind's API group, so each operator's annotations are its own).
    """

    def __init__(self, hub: type[H], *, preserve_prefix: str | None = None) -> None:
        self.hub = hub
        self.group = hub.resource.group
        self.kind = hub.resource.kind
        self.preserve_prefix = preserve_prefix or self.group
        self._models: dict[str, type[CustomResource]] = {hub.resource.api_version: hub}
        self._spokes: dict[str, _Spoke] = {}

    def spoke(self, model: type[S], *, to_hub: Callable[[S], H], from_hub: Callable[[H], S]) -> None:
        """Declare ``model`` a version of this kind, converted by ``to_hub`` and ``from_hub``."""
        info = model.resource
        if (info.group, info.kind) != (self.group, self.kind):
            raise ConversionError(f"{model.__name__} is {info.kind}.{info.group}, not {self.kind}.{self.group}")
        if info.api_version in self._models:
            raise ConversionError(f"{self.kind}: version {info.version} is declared twice")
        self._models[info.api_version] = model
        self._spokes[info.api_version] = _Spoke(model, to_hub, from_hub)

    @property
    def resources(self) -> tuple[type[CustomResource], ...]:
        """Every version's model, hub first: what ``crd_for`` takes."""
        return tuple(self._models.values())

    def annotation(self, version: str) -> str:
        """The annotation holding what other versions could not hold of ``version``'s body."""
        return f"{self.preserve_prefix}/preserved-{version}"

    def convert(self, obj: Mapping[str, Any], desired_api_version: str) -> Obj:
        """``obj`` in ``desired_api_version``: metadata untouched but for the preservation annotations."""
        source_version, target_version = str(obj.get("apiVersion")), desired_api_version
        self._model(source_version)
        self._model(target_version)
        if source_version == target_version:
            return dict(obj)
        metadata = dict(obj.get("metadata") or {})
        annotations = dict(metadata.get("annotations") or {})
        target_key = self.annotation(_version_of(target_version))
        source_key = self.annotation(_version_of(source_version))
        stored = annotations.pop(target_key, None)
        annotations.pop(source_key, None)
        current = self._body(self._plain(obj, target_version))
        if stored is not None:
            current = self._restore(current, stored, source_version, target_version)
        source_body = self._body(self._plain(obj, source_version))
        if self._body(self._plain({**current, "apiVersion": target_version}, source_version)) != source_body:
            annotations[source_key] = json.dumps(source_body, sort_keys=True, separators=(",", ":"))
        if annotations:
            metadata["annotations"] = annotations
        else:
            metadata.pop("annotations", None)
        return {"apiVersion": target_version, "kind": self.kind, "metadata": metadata, **current}

    def _restore(self, current: Obj, stored_text: str, source: str, target: str) -> Obj:
        """``current`` with what a round trip through ``source`` lost of the stored body put back."""
        try:
            stored = json.loads(stored_text)
            if not isinstance(stored, dict):
                raise ValueError("not an object")
            projected = self._body(self._plain(self._plain({**stored, "apiVersion": target}, source), target))
            merged: Obj = _three_way(current, projected, stored)
            self._plain({**merged, "apiVersion": target}, target)  # still valid in the target version?
        except (ValueError, ConversionError) as error:
            # A damaged or outdated annotation must not block reads: the object as its version shows it wins.
            log.warning("preserved data dropped", kind=self.kind, version=target, error=str(error))
            return current
        return merged

    def _plain(self, obj: Mapping[str, Any], target_api_version: str) -> Obj:
        """``obj`` (apiVersion + body) converted to ``target_api_version`` through the hub, without preservation."""
        source_api_version = str(obj.get("apiVersion"))
        data = {key: value for key, value in obj.items() if key != "metadata"}
        try:
            model = self._model(source_api_version).model_validate(data)
        except ValidationError as error:
            raise ConversionError(f"invalid as {source_api_version}: {_first_error(error)}") from error
        result: CustomResource = model
        if source_api_version != target_api_version:
            if source_api_version in self._spokes:
                result = self._spokes[source_api_version].to_hub(result)
            if target_api_version in self._spokes:
                result = self._spokes[target_api_version].from_hub(result)
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)

    def _model(self, api_version: str) -> type[CustomResource]:
        model = self._models.get(api_version)
        if model is None:
            served = ", ".join(self._models)
            raise ConversionError(f"{self.kind} has no version {api_version!r} (this operator knows {served})")
        return model

    @staticmethod
    def _body(obj: Mapping[str, Any]) -> Obj:
        return {key: value for key, value in obj.items() if key not in _TYPE_META}


class Conversions:
    """Every kind an operator converts, keyed by (group, kind): what its conversion webhook serves."""

    def __init__(self, *conversions: Conversion[Any]) -> None:
        self._by_kind: dict[tuple[str, str], Conversion[Any]] = {}
        for conversion in conversions:
            self.add(conversion)

    def add(self, conversion: Conversion[Any]) -> None:
        key = (conversion.group, conversion.kind)
        if key in self._by_kind:
            raise ConversionError(f"{conversion.kind}.{conversion.group} is registered twice")
        self._by_kind[key] = conversion

    def __iter__(self) -> Iterator[Conversion[Any]]:
        return iter(self._by_kind.values())

    def for_kind(self, group: str, kind: str) -> Conversion[Any]:
        conversion = self._by_kind.get((group, kind))
        if conversion is None:
            raise ConversionError(f"this operator converts no {kind}.{group}")
        return conversion

    def convert(self, obj: Mapping[str, Any], desired_api_version: str) -> Obj:
        """``obj`` converted to ``desired_api_version`` (same group) by the conversion of its kind."""
        group = desired_api_version.rpartition("/")[0]
        return self.for_kind(group, str(obj.get("kind"))).convert(obj, desired_api_version)


def _version_of(api_version: str) -> str:
    return api_version.rpartition("/")[2]


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "<root>"
    return f"{where}: {first['msg']}"


def _three_way(current: Any, projected: Any, stored: Any) -> Any:
    """Put back into ``current`` what ``stored`` has and its round trip (``projected``) lost.

    Where ``current`` differs from ``projected`` the user changed it through the other version: ``current`` wins.
    Objects merge key by key; anything else (lists included) is one value.
    """
    if not (isinstance(current, dict) and isinstance(projected, dict) and isinstance(stored, dict)):
        return current
    merged = dict(current)
    for key in stored.keys() | projected.keys():
        kept, lost = projected.get(key, _MISSING), stored.get(key, _MISSING)
        if kept == lost:
            continue
        now = current.get(key, _MISSING)
        if isinstance(lost, dict) and isinstance(kept, dict) and isinstance(now, dict):
            merged[key] = _three_way(now, kept, lost)
        elif now == kept:
            if lost is _MISSING:
                merged.pop(key, None)
            else:
                merged[key] = lost
    return merged
