"""Whether ``-rw`` routes to the primary yet: ``Ready`` waits for it (issue 29 item 3).

An instance reporting ready is not yet a primary clients can reach: its pod must carry the ``primary`` role label
(written by an earlier pass: this pass read the pods before it labelled them), and the EndpointSlice controller must
have put its address, ready, behind ``-rw``. Without this, a connection right after ``kubectl wait
--for=condition=Ready`` was refused for about a second.

The label is checked every pass (from the cache); the EndpointSlices are listed only while ``Ready`` is not True,
the primary changed, or a failover or switchover finished within the last minute (one LIST per such pass). A
slice that lists no endpoint at all says nothing (a control plane without the EndpointSlice controller, or addresses
it does not publish); an operator not allowed to list EndpointSlices logs it once and relies on the labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from kanri.postgres import names
from kanri.postgres.context import ClusterStep
from kanri.postgres.labels import PRIMARY, ROLE
from kanri.runtime import ApiError
from kanri.runtime.kinds import ENDPOINT_SLICE

__all__ = ["unrouted"]

Obj = dict[str, Any]
log = structlog.get_logger("kanri.postgres.cluster.routed")
_SERVICE_NAME = "kubernetes.io/service-name"


class _Refused:
    """Whether listing EndpointSlices was refused (403) once: then never asked again by this operator."""

    slices = False


async def _addresses(step: ClusterStep, service: str) -> list[Obj] | None:
    """The endpoints of ``service``'s EndpointSlices, or None when they cannot be read."""
    if _Refused.slices:
        return None
    try:
        slices, _ = await step.client.list(ENDPOINT_SLICE, step.namespace, label_selector=f"{_SERVICE_NAME}={service}")
    except ApiError as exc:
        if exc.status != 403:
            raise
        _Refused.slices = True
        log.warning("not allowed to list EndpointSlices: Ready does not wait for -rw to route to the primary")
        return None
    return [e for s in slices for e in s.get("endpoints") or ()]


async def unrouted(step: ClusterStep, primary: str | None, pods: Mapping[str, Obj], *, slices: bool) -> str | None:
    """Why ``-rw`` does not route to ``primary``'s pod yet, or None when it does (as far as can be told); ``slices``:
    also read ``-rw``'s EndpointSlices (else only the label, from the cache)."""
    pod = pods.get(primary) if primary else None
    if pod is None or primary is None:
        return None  # no primary to route to: Ready says so already
    if ((pod["metadata"].get("labels") or {}).get(ROLE)) != PRIMARY:
        return f"{primary}'s pod is not labelled primary yet"
    status = pod.get("status") or {}
    service = names.read_write_service(step.name)
    endpoints = await _addresses(step, service) if slices else None
    if not endpoints:
        return None
    address = status.get("podIP")
    if any(address in (e.get("addresses") or ()) and (e.get("conditions") or {}).get("ready") is not False
           for e in endpoints):  # fmt: skip
        return None
    return f"{service} does not route to {primary} yet"
