"""Installing a CustomResourceDefinition and waiting until the API server serves it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kanri.runtime._client import Client
from kanri.runtime._conditions import get_condition
from kanri.runtime._crd import CustomResource, crd_for
from kanri.runtime._kinds import CRD

Obj = dict[str, Any]


class CrdNotEstablished(RuntimeError):
    """The API server did not start serving a CRD: its names conflict with another, or it took too long."""


async def install_crd(
    client: Client,
    crd: Obj | type[CustomResource],
    *,
    field_manager: str,
    timeout: float = 60.0,
    interval: float = 0.1,
) -> Obj:
    """Server-side apply ``crd`` (a CustomResourceDefinition dict, or a resource class for :func:`crd_for`) and
    return it once its ``Established`` condition is True, that is once the API server serves the new kind.

    Starting informers (a Manager) on a kind before then makes their LIST and WATCH answer 404 until it is served.
    Raises :class:`CrdNotEstablished` when ``NamesAccepted`` is False (a name taken by another CRD) or after
    ``timeout`` seconds. Idempotent: an installed, unchanged CRD returns at once.
    """
    body = crd_for(crd) if isinstance(crd, type) else crd
    name = str(body["metadata"]["name"])
    current = await client.apply(CRD, body, field_manager=field_manager)
    deadline = time.monotonic() + timeout
    while True:
        conditions = (current.get("status") or {}).get("conditions")  # null until the server has looked at it
        names = get_condition(conditions, "NamesAccepted")
        if names is not None and names.get("status") == "False":
            raise CrdNotEstablished(f"CRD {name}: names not accepted: {names.get('message', '')}")
        established = get_condition(conditions, "Established")
        if established is not None and established.get("status") == "True":
            return current
        if time.monotonic() >= deadline:
            raise CrdNotEstablished(f"CRD {name} not established after {timeout:g}s (conditions: {conditions})")
        await asyncio.sleep(interval)
        current = await client.get(CRD, name)
