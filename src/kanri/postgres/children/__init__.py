"""Builders of a PostgresCluster's child objects: pure functions from the cluster (and a few observed facts) to the
objects the operator applies. Nothing here talks to the API."""

from __future__ import annotations

from typing import Any

from kanri.postgres.cluster.diff import with_hash
from kanri.runtime import owner_reference

__all__ = ["child_meta", "owned"]

Obj = dict[str, Any]


def child_meta(cluster: Obj, name: str, labels: dict[str, str]) -> Obj:
    """``metadata`` of a child controlled by ``cluster`` (so it is garbage-collected with it)."""
    return {
        "name": name,
        "namespace": cluster["metadata"]["namespace"],
        "labels": labels,
        "ownerReferences": [owner_reference(cluster)],
    }


def owned(api_version: str, kind: str, metadata: Obj, **body: Any) -> Obj:
    """A complete child object, with the hash of itself recorded (see :mod:`kanri.postgres.cluster.diff`)."""
    return with_hash({"apiVersion": api_version, "kind": kind, "metadata": metadata, **body})
