"""Writing a status: compute what it should be, patch only what differs."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from kanri.runtime._client import Client
from kanri.runtime._conditions import set_condition
from kanri.runtime._kinds import Kind

Obj = dict[str, Any]


async def update_status(
    client: Client,
    kind: Kind,
    obj: Mapping[str, Any],
    *,
    fields: Mapping[str, Any] | None = None,
    conditions: Sequence[Mapping[str, Any]] = (),
    field_manager: str | None = None,
    now: datetime | None = None,
) -> bool:
    """Bring ``obj``'s status to ``fields`` and ``conditions`` with one merge patch of what differs; True if written.

    ``fields`` are top-level status fields (``{"observedGeneration": 3, "phase": "Running"}``; None removes one).
    Each of ``conditions`` holds :func:`set_condition`'s keywords (``type``, ``status``, ``reason``, ``message``,
    optionally ``observed_generation``, which defaults to the object's ``metadata.generation``); conditions of other
    types are kept. Nothing is sent when the status already says all that, so a converged object costs no write.
    When conditions change, the patch carries the object's resourceVersion (the list is replaced whole, and must
    not overwrite a condition someone else just wrote): a 409 means ``obj`` was stale, retry from a fresh read.
    ``obj`` is not changed.
    """
    meta = obj["metadata"]
    status: Mapping[str, Any] = obj.get("status") or {}
    patch: Obj = {}
    for name, value in (fields or {}).items():
        if status.get(name) != value:
            patch[name] = value
    if conditions:
        current = copy.deepcopy(list(status.get("conditions") or []))
        changed = False
        for condition in conditions:
            arguments = {"observed_generation": meta.get("generation"), **condition}
            changed |= set_condition(current, now=now, **arguments)
        if changed:
            patch["conditions"] = current
    if not patch:
        return False
    body: Obj = {"status": patch}
    if "conditions" in patch:
        body["metadata"] = {"resourceVersion": meta["resourceVersion"]}
    await client.patch_status(kind, meta["name"], body, meta.get("namespace"), field_manager=field_manager)
    return True
