"""Kinds the local node touches, and its final pod delete."""

from __future__ import annotations

from typing import Any

from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import NODE, PERSISTENT_VOLUME, POD, STORAGE_CLASS

__all__ = ["NODE", "NODE_LEASE_NAMESPACE", "PERSISTENT_VOLUME", "STORAGE_CLASS", "delete_now"]

NODE_LEASE_NAMESPACE = "kube-node-lease"
"""Where kubelets renew their heartbeat Lease (named after the node)."""


async def delete_now(client: Client, pod: dict[str, Any]) -> None:
    """The kubelet's final delete of a pod whose processes are gone: ``gracePeriodSeconds: 0`` with a uid
    precondition (without a grace period of 0 the API server keeps a terminating pod forever, even in a terminal
    phase). A pod already gone (404, handled by ``delete``) or replaced by a new one (409) is fine.
    """
    meta = pod["metadata"]
    try:
        await client.delete(POD, meta["name"], meta["namespace"], uid=meta["uid"], grace_period_seconds=0)
    except ApiError as exc:
        if not exc.conflict:
            raise
