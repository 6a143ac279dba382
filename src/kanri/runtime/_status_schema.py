"""Will a status condition stick? A check of a CustomResourceDefinition's schema, made when a controller starts.

After a :class:`~kanri.runtime.PermanentError` the runtime writes a ``Ready=False`` condition (see
``ControllerOptions.permanent_error_condition``) to ``status.conditions``. The API server prunes every field its
CRD's schema does not declare, and answers the write with success all the same: on a status without
``conditions`` the reason the user must read vanishes without a trace. So the controller reads its primary kind's
CRD once at start-up and warns, naming the fix, when the condition could not be kept.

Why a warning and not a refusal to start: the condition is the runtime's courtesy, not the reconciler's contract,
and turning its loss into an outage of the whole operator is the worse trade (kanri's own PostgresBackup has no
``conditions``); the check cannot always be made (an operator's role often may not read CRDs); and the write
itself is checked too (the controller warns whenever the answer to its status patch lacks the condition), so the
loss is never silent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from kanri.runtime._client import Client
from kanri.runtime._errors import ApiError
from kanri.runtime._kinds import CRD, Kind

__all__ = ["conditions_problem", "read_conditions_problem"]

log = structlog.get_logger("kanri.controller")

# The fields of metav1.Condition a user reads (observedGeneration is optional).
_NEEDED = ("type", "status", "lastTransitionTime", "reason", "message")
_FIX = (
    "add `conditions: kanri.runtime.Conditions` to the status model (and reinstall the CRD), "
    "or set ControllerOptions(permanent_error_condition=None)"
)


def _keeps_unknown(node: Mapping[str, Any]) -> bool:
    return node.get("x-kubernetes-preserve-unknown-fields") is True


def conditions_problem(crd: Mapping[str, Any], version: str) -> str | None:
    """Why a condition written to ``status.conditions`` of ``version`` objects would not be kept, with the fix; None
    when it would be (or when ``crd`` does not serve ``version``: nothing to say then)."""
    name = (crd.get("metadata") or {}).get("name", "?")
    entry = next((v for v in (crd.get("spec") or {}).get("versions") or () if v.get("name") == version), None)
    if entry is None:
        return None
    where = f"CRD {name} version {version}"
    if "status" not in (entry.get("subresources") or {}):
        return f"{where} has no status subresource, so a status write is refused: {_FIX}"
    root = (entry.get("schema") or {}).get("openAPIV3Schema") or {}
    status = (root.get("properties") or {}).get("status")
    if status is None:
        if _keeps_unknown(root):
            return None
        return f"{where} declares no status: the API server prunes status.conditions from every write; {_FIX}"
    conditions = (status.get("properties") or {}).get("conditions")
    if conditions is None:
        if _keeps_unknown(status):
            return None
        return f"{where} declares no status.conditions: the API server prunes them from every write; {_FIX}"
    if conditions.get("type") != "array":
        return f"{where}: status.conditions is not a list of conditions; {_FIX}"
    items = conditions.get("items") or {}
    if _keeps_unknown(items):
        return None
    missing = [field for field in _NEEDED if field not in (items.get("properties") or {})]
    if missing:
        return f"{where}: status.conditions items lack {', '.join(missing)}, which the API server prunes; {_FIX}"
    return None


async def read_conditions_problem(client: Client, kind: Kind) -> str | None:
    """:func:`conditions_problem` for ``kind``'s CRD as the API server has it; None when ``kind`` is not served by
    a CRD (a built-in kind) or the CRD cannot be read (the operator's role may not allow it)."""
    if "." not in kind.group:
        return None  # core and built-in groups ("", "apps", "batch"): a CRD's group always has a dot
    try:
        crd = await client.get(CRD, f"{kind.plural}.{kind.group}")
    except ApiError as error:
        if not error.not_found:
            log.debug("could not read the CRD to check its status schema", kind=str(kind), status=error.status)
        return None  # not found: a built-in or aggregated API
    return conditions_problem(crd, kind.version)
