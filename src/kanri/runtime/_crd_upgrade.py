"""An operator brings its own CRDs up to date at start, and an older operator never overwrites a newer CRD.

Helm installs a chart's ``crds/`` once and never updates them, so a ``helm upgrade`` alone leaves the old schema in
place while the new operator serves the new one. :func:`upgrade_crds` closes that gap: before the manager starts,
the operator writes the CRDs it was built with, stamped with its version and a digest of their spec. An operator
finding a CRD stamped by a *newer* operator with a *different* spec (a rollback, an old replica restarting) refuses
to start and says which versions met; the same spec under a newer stamp (a release that did not change the CRD) is
left alone and the operator runs.

The CRD is replaced whole (a PUT guarded by its resourceVersion), not server-side applied: a CRD first created by
Helm is owned by Helm's field manager, and an apply would leave behind every field the new CRD drops (a removed
property, an old version). Only the conversion webhook's ``caBundle``, which the runtime manages in place, is kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from kanri.runtime._client import Client
from kanri.runtime._conditions import get_condition
from kanri.runtime._errors import ApiError
from kanri.runtime._kinds import CRD

Obj = dict[str, Any]

VERSION_ANNOTATION = "kanri.dev/operator-version"
"""The version of the operator that last wrote the CRD."""
DIGEST_ANNOTATION = "kanri.dev/crd-digest"
"""sha256 (first 16 hex digits) of the CRD's ``spec`` as that operator wrote it, ``caBundle`` left out."""


class CrdDowngradeRefused(RuntimeError):
    """A CRD was written by a newer operator with a different spec: this (older) operator must not run against it."""


class CrdUpgradeFailed(RuntimeError):
    """A CRD could not be written (no right to, a conflict that kept coming back) or was not served in time."""


@dataclass(frozen=True)
class CrdUpgrade:
    """What :func:`upgrade_crds` did with one CRD."""

    name: str
    action: str
    """``created``, ``upgraded`` (written over an older or unstamped one), ``unchanged`` (same version and spec) or
    ``newer-kept`` (a newer operator's CRD with this operator's spec, left as it is)."""
    installed_version: str | None
    """The version stamped on the CRD before (None: absent or unstamped)."""


def crd_digest(crd: Obj) -> str:
    """The digest :data:`DIGEST_ANNOTATION` holds: of ``spec`` without the conversion webhook's ``caBundle``."""
    spec = orjson.loads(orjson.dumps(crd.get("spec") or {}))
    client_config = ((spec.get("conversion") or {}).get("webhook") or {}).get("clientConfig") or {}
    client_config.pop("caBundle", None)
    return hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def version_key(version: str) -> tuple[int, ...]:
    """``1.2.3`` (or ``v1.2.3-rc.1``) as ``(1, 2, 3)`` for ordering; a pre-release orders as its release."""
    found = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    if found is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in found.group(1).split("."))


async def upgrade_crds(
    client: Client,
    crds: Sequence[Obj],
    *,
    operator_version: str,
    timeout: float = 60.0,
) -> list[CrdUpgrade]:
    """Bring ``crds`` (CustomResourceDefinition dicts) up to this operator's version, then wait until each is
    Established. Every CRD is checked before any is written, so a refusal changes nothing.

    Raises :class:`CrdDowngradeRefused` naming both versions when a CRD was written by a newer operator and its spec
    differs from this operator's, and :class:`CrdUpgradeFailed` when a write is forbidden (the operator's RBAC names
    its CRDs for ``get`` and ``update`` only: a missing CRD is created by the chart's ``crds/``) or the API server
    does not serve a CRD within ``timeout`` seconds.
    """
    mine = version_key(operator_version)
    plans: list[tuple[Obj, Obj | None, str]] = []
    for crd in crds:
        installed = await _read(client, crd["metadata"]["name"])
        plans.append((crd, installed, _decide(crd, installed, operator_version, mine)))
    results = []
    for crd, installed, action in plans:
        if action in ("created", "upgraded"):
            action = await _write(client, crd, installed, operator_version, mine)
        await _established(client, crd["metadata"]["name"], timeout)
        results.append(CrdUpgrade(crd["metadata"]["name"], action, _stamp(installed, VERSION_ANNOTATION)))
    return results


def _stamp(crd: Obj | None, annotation: str) -> str | None:
    if crd is None:
        return None
    value = ((crd.get("metadata") or {}).get("annotations") or {}).get(annotation)
    return str(value) if value is not None else None


def _decide(crd: Obj, installed: Obj | None, operator_version: str, mine: tuple[int, ...]) -> str:
    if installed is None:
        return "created"
    theirs = _stamp(installed, VERSION_ANNOTATION)
    same_spec = _stamp(installed, DIGEST_ANNOTATION) == crd_digest(crd)
    if theirs is None or version_key(theirs) < mine:
        return "upgraded"
    if version_key(theirs) == mine:
        return "unchanged" if same_spec else "upgraded"  # a development build of the same version: last one wins
    if same_spec:
        return "newer-kept"
    name = crd["metadata"]["name"]
    raise CrdDowngradeRefused(
        f"CRD {name} was written by kanri operator {theirs}; this operator is {operator_version} and carries a "
        f"different {name}: it will not downgrade the CRD and does not start. Run operator {theirs} (or newer) "
        f"again; see docs/helm.md, 'Upgrades and the CRDs'."
    )


async def _read(client: Client, name: str) -> Obj | None:
    try:
        return await client.get(CRD, name)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise CrdUpgradeFailed(f"reading CRD {name}: {exc}") from exc


def _stamped(crd: Obj, operator_version: str) -> Obj:
    body: Obj = orjson.loads(orjson.dumps(crd))
    annotations = body["metadata"].setdefault("annotations", {})
    annotations[VERSION_ANNOTATION] = operator_version
    annotations[DIGEST_ANNOTATION] = crd_digest(crd)
    return body


def _keep_ca_bundle(body: Obj, installed: Obj) -> None:
    # The runtime's certificate rotation keeps caBundle current in place; a CRD that names none must not drop it.
    def config(crd: Obj) -> Obj:
        return dict((((crd.get("spec") or {}).get("conversion") or {}).get("webhook") or {}).get("clientConfig") or {})

    bundle = config(installed).get("caBundle")
    target = ((body["spec"].get("conversion") or {}).get("webhook") or {}).get("clientConfig")
    if bundle and isinstance(target, dict) and not target.get("caBundle"):
        target["caBundle"] = bundle


async def _write(client: Client, crd: Obj, installed: Obj | None, operator_version: str, mine: tuple[int, ...]
                 ) -> str:  # fmt: skip
    """Create or replace ``crd``; after a conflict (another replica, a newer operator or the caBundle rotation wrote
    first) read it again and decide again, so a newer operator's CRD written meanwhile is never overwritten."""
    name = crd["metadata"]["name"]
    action = _decide(crd, installed, operator_version, mine)
    for _ in range(5):
        if action not in ("created", "upgraded"):
            return action
        body = _stamped(crd, operator_version)
        try:
            if installed is None:
                await client.create(CRD, body)
                return action
            body["metadata"]["resourceVersion"] = installed["metadata"]["resourceVersion"]
            body["metadata"]["labels"] = {**(installed["metadata"].get("labels") or {}), **_labels(crd)}
            _keep_ca_bundle(body, installed)
            await client.replace(CRD, body)
            return action
        except ApiError as exc:
            if exc.status not in (409, 404):  # 409 from a replace, or a create when another replica created it
                raise CrdUpgradeFailed(f"writing CRD {name} (operator {operator_version}): {exc}") from exc
        installed = await _read(client, name)
        action = _decide(crd, installed, operator_version, mine)
    raise CrdUpgradeFailed(f"writing CRD {name}: it kept changing under this operator (5 conflicts)")


def _labels(crd: Obj) -> dict[str, str]:
    return dict(crd["metadata"].get("labels") or {})


async def _established(client: Client, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        current = await client.get(CRD, name)
        conditions = (current.get("status") or {}).get("conditions")
        names = get_condition(conditions, "NamesAccepted")
        if names is not None and names.get("status") == "False":
            raise CrdUpgradeFailed(f"CRD {name}: names not accepted: {names.get('message', '')}")
        established = get_condition(conditions, "Established")
        if established is not None and established.get("status") == "True":
            return
        if time.monotonic() >= deadline:
            raise CrdUpgradeFailed(f"CRD {name} not established after {timeout:g}s (conditions: {conditions})")
        await asyncio.sleep(0.1)
