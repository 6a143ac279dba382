"""Typed, read-only views of raw objects: the cache's dicts, seen through ``TypedDict`` types, at no cost.

The hot path keeps objects as the JSON dicts the API server sent (copying each into a model on every reconcile
costs microseconds per object and hides nothing a reconciler needs). A view is the same dict, typed: mypy then
refuses a key typo (``view["spec"]["succesfulJobsHistoryLimit"]``: *TypedDict has no key*) and any write (the
fields are ``ReadOnly`` and lists ``Sequence``, so the shared cached object cannot be changed by accident).
:func:`as_view` is a ``cast``: nothing is copied or checked at run time.

A resource's view types are generated from its model by :func:`kanri.runtime.view_source`; the metadata part is
:class:`ObjectMetaView`, the same for every kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, TypeVar, cast, overload

if TYPE_CHECKING:
    # Only the type checker needs it (mypy ships the stub): views are plain dicts at run time.
    from typing_extensions import ReadOnly

__all__ = ["ObjectMetaView", "OwnerReferenceView", "as_view"]

V = TypeVar("V", bound=Mapping[str, Any])


class OwnerReferenceView(TypedDict):
    """One entry of ``metadata.ownerReferences``."""

    apiVersion: ReadOnly[str]
    kind: ReadOnly[str]
    name: ReadOnly[str]
    uid: ReadOnly[str]
    controller: ReadOnly[NotRequired[bool]]
    blockOwnerDeletion: ReadOnly[NotRequired[bool]]


class ObjectMetaView(TypedDict):
    """``metadata`` of an object read from the API (times are RFC 3339 strings: see :func:`creation_time`)."""

    name: ReadOnly[str]
    namespace: ReadOnly[NotRequired[str]]
    uid: ReadOnly[str]
    resourceVersion: ReadOnly[str]
    generation: ReadOnly[NotRequired[int]]
    creationTimestamp: ReadOnly[str]
    deletionTimestamp: ReadOnly[NotRequired[str]]
    deletionGracePeriodSeconds: ReadOnly[NotRequired[int]]
    generateName: ReadOnly[NotRequired[str]]
    labels: ReadOnly[NotRequired[Mapping[str, str]]]
    annotations: ReadOnly[NotRequired[Mapping[str, str]]]
    ownerReferences: ReadOnly[NotRequired[Sequence[OwnerReferenceView]]]
    finalizers: ReadOnly[NotRequired[Sequence[str]]]
    managedFields: ReadOnly[NotRequired[Sequence[Mapping[str, Any]]]]


@overload
def as_view(obj: None, view: type[V]) -> None: ...
@overload
def as_view(obj: Mapping[str, Any], view: type[V]) -> V: ...
@overload
def as_view(obj: Mapping[str, Any] | None, view: type[V]) -> V | None: ...
def as_view(obj: Mapping[str, Any] | None, view: type[V]) -> V | None:
    """``obj`` typed as ``view`` (a generated ``TypedDict``), or None for None: ``as_view(cache.get(...), View)``.

    A cast, not a check: the dict is returned as it is. The types say what the CRD's schema lets the API server
    store, so they hold for any object of that kind read from the API."""
    return cast("V | None", obj)  # a string: `V | None` would build a Union on every call
