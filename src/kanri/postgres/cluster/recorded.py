"""What the operator learned from the instances' reports, recorded as annotations on their claims.

The claims are the data: they survive an operator restart, a deleted PostgresCluster (``Retain``) and a rewritten
status. So the facts that decide what may be done to the data live on them:

| annotation | on | value |
|---|---|---|
| ``kanri.dev/last-primary`` | the claim of the instance last seen reporting primary (only one) | ``"true"`` |
| ``kanri.dev/timeline`` | that claim | the primary's timeline when last seen |
| ``kanri.dev/pg-major`` | every claim whose instance reported ``dataVersion`` | the data directory's major |
| ``kanri.dev/system-identifier`` | every claim whose instance reported it | the data's system identifier |

Pure functions: what to read back (:func:`recorded_primary`, :func:`recorded_major`,
:func:`recorded_system_identifier`) and which merge patches bring the annotations up to date
(:func:`annotation_patches`, empty once they are: a converged pass writes nothing).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kanri.postgres.cluster.instances import InstanceReport

__all__ = [
    "LAST_PRIMARY",
    "PG_MAJOR",
    "SYSTEM_IDENTIFIER",
    "TIMELINE",
    "annotation_patches",
    "recorded_major",
    "recorded_primary",
    "recorded_system_identifier",
]

Obj = dict[str, Any]

LAST_PRIMARY = "kanri.dev/last-primary"
TIMELINE = "kanri.dev/timeline"
PG_MAJOR = "kanri.dev/pg-major"
SYSTEM_IDENTIFIER = "kanri.dev/system-identifier"


def _annotations(claim: Obj) -> dict[str, str]:
    return dict(claim.get("metadata", {}).get("annotations") or {})


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def recorded_primary(claims: Iterable[Obj]) -> str | None:
    """The claim (= instance) marked last primary; with several (an interrupted update), the highest timeline."""
    marked = [
        (-(_number(a.get(TIMELINE)) or 0), str(c["metadata"]["name"]))
        for c in claims
        if (a := _annotations(c)).get(LAST_PRIMARY) == "true"
    ]
    return min(marked)[1] if marked else None


def recorded_major(claims: Mapping[str, Obj], primary: str | None) -> int | None:
    """The major of the data: the primary's claim's record, else the lowest any claim records (a replica holds the
    primary's major; a disagreement is the instances' DataVersionMismatch to report, never a reason to upgrade)."""
    own = _number(_annotations(claims[primary]).get(PG_MAJOR)) if primary is not None and primary in claims else None
    if own is not None:
        return own
    majors = [m for c in claims.values() if (m := _number(_annotations(c).get(PG_MAJOR))) is not None]
    return min(majors, default=None)


def recorded_system_identifier(claims: Mapping[str, Obj], primary: str | None) -> str | None:
    """The cluster's system identifier as recorded on the primary's claim, else on the last-primary claim."""
    for name in (primary, recorded_primary(claims.values())):
        if name is not None and name in claims:
            found = _annotations(claims[name]).get(SYSTEM_IDENTIFIER)
            if found is not None and found.isdigit():
                return found
    return None


def annotation_patches(
    claims: Mapping[str, Obj], reports: Mapping[str, InstanceReport], primary: str | None
) -> dict[str, Obj]:
    """Claim name -> merge patch of its annotations, for the claims whose record differs from the reports.

    The last-primary mark moves only to ``primary``, the instance confirmed primary this pass (``splitbrain.decide``:
    never a second primary, whatever its timeline); without one, the old mark is the best knowledge there is."""
    if primary is not None and (primary not in reports or reports[primary].role != "primary"):
        primary = None
    patches: dict[str, Obj] = {}
    for name, claim in claims.items():
        if claim.get("metadata", {}).get("deletionTimestamp"):
            continue
        have = _annotations(claim)
        want: dict[str, str | None] = {}
        report = reports.get(name)
        if report is not None and report.data_version is not None:
            want[PG_MAJOR] = str(report.data_version)
        if report is not None and report.system_identifier is not None:
            want[SYSTEM_IDENTIFIER] = report.system_identifier
        if primary is not None and name == primary:
            want[LAST_PRIMARY] = "true"
            if reports[name].timeline is not None:
                want[TIMELINE] = str(reports[name].timeline)
        elif primary is not None and LAST_PRIMARY in have:
            want[LAST_PRIMARY] = None
            want[TIMELINE] = None
        changed = {key: value for key, value in want.items() if have.get(key) != value}
        if changed:
            patches[name] = {"metadata": {"annotations": changed}}
    return patches
