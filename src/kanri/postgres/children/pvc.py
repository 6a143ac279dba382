"""Each instance's data volume: a PersistentVolumeClaim the operator creates itself.

Not a ``volumeClaimTemplate``: the operator must be able to grow it (templates are immutable) and to keep it after
the StatefulSet is gone. It carries **no owner reference**, so garbage collection never deletes data; the operator
deletes a claim only when it removes a replica on scale-down, or under ``deletionPolicy: Delete``.
"""

from __future__ import annotations

from typing import Any

from kanri.postgres.labels import instance_labels
from kanri.runtime import parse_quantity

__all__ = ["claim", "claim_capacity", "claim_request", "grow_patch"]

Obj = dict[str, Any]


def claim(cluster: Obj, instance: str, size: str, storage_class: str | None) -> Obj:
    """The claim of ``instance`` (same name), ReadWriteOnce, ``size`` requested."""
    spec: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    meta = cluster["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": instance,
            "namespace": meta["namespace"],
            "labels": instance_labels(meta["name"], instance),
        },
        "spec": spec,
    }


def claim_request(pvc: Obj) -> str | None:
    """The storage the claim asks for."""
    value = ((pvc.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
    return str(value) if value is not None else None


def claim_capacity(pvc: Obj) -> str | None:
    """The storage the bound volume has (absent while Pending)."""
    value = ((pvc.get("status") or {}).get("capacity") or {}).get("storage")
    return str(value) if value is not None else None


def grow_patch(pvc: Obj, size: str) -> Obj | None:
    """The merge patch raising the claim's request to ``size``, or None when it asks for that much already (a claim
    is never shrunk: the API server refuses it, and data does not fit in less)."""
    current = claim_request(pvc)
    if current is not None and parse_quantity(current) >= parse_quantity(size):
        return None
    return {"spec": {"resources": {"requests": {"storage": size}}}}
