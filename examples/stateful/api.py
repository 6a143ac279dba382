"""The KeyValueStore kind: its spec, its status, and the operator's names."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kanri import kit
from kanri import runtime as kr


class KeyValueStoreSpec(kr.KubeModel):
    data: dict[str, str] = Field(default_factory=dict)
    """The keys and values to publish in the ``<name>-data`` ConfigMap. Removing a key needs an approval."""
    deletion_policy: Literal["Retain", "Delete"] = "Retain"
    """What deleting the store does to its ``<name>-key`` Secret: Retain keeps it for a new store of that name."""


class Rotation(kr.KubeModel):
    """A key rotation under way: on record before the key changes, so a restarted operator finishes it."""

    request: str
    """The ``rotate-key`` annotation's value being handled."""
    phase: Literal["Rotating"] = "Rotating"


class KeyValueStoreStatus(kit.KitStatus):
    keys: int | None = None
    """How many keys the ConfigMap publishes."""
    rotation: Rotation | None = None


class KeyValueStore(kr.CustomResource, group="example.kanri.dev", version="v1", kind="KeyValueStore",
                    plural="keyvaluestores", short_names=("kvs",),
                    printer_columns=(kr.PrinterColumn("Keys", ".status.keys", type="integer"),)):  # fmt: skip
    """Key-value data published as a ConfigMap, with a generated key Secret kept per deletionPolicy."""

    spec: KeyValueStoreSpec
    status: KeyValueStoreStatus | None = None


KIND = KeyValueStore.resource.api_kind
LABELS = kit.LabelSet("example.kanri.dev", "keyvaluestore", owner_key="store")
FIELD_MANAGER = "keyvaluestore-operator"
FINALIZER = LABELS.key("cleanup")
ROTATE = LABELS.key("rotate-key")
"""``kubectl annotate kvs NAME example.kanri.dev/rotate-key=<new value>``: a new key in the Secret."""
APPROVE_REMOVAL = LABELS.key("approve-removal")
"""Approves removing exactly the keys (and generation) the Ready condition names."""
ROTATED = LABELS.key("rotated-for")
"""On the Secret: the rotation request its key was made for."""


def data_name(store: str) -> str:
    return kr.child_name(store, "data")


def key_name(store: str) -> str:
    return kr.child_name(store, "key")
