"""What a failover may have lost, said as it is known — the words of ``status.lastFailover`` and of the
``FailedOver`` and ``FailoverLossMeasured`` Events.

Two moments know different things:

- At the promotion the operator knows the old primary's WAL position only as it was last seen. A gap as last seen
  is a lower bound: in mode Async the old primary may have written (and acknowledged) more after that, so loss stays
  possible even when that gap is 0. A gap of 0 bounds nothing then, so it is not recorded
  (``lsnGapBytes`` absent, ``dataLossPossible: true``): the record never says "possible loss" and "0 bytes"
  together. When the position was never known (an approved promotion after an operator restart), the size is
  unknown and the Event says so.
- When the old primary rejoins, it measures the WAL it had written past the switchpoint before pg_rewind or a clone
  discards it (``divergedBytes``). That is the WAL lost. Whether commits in it were acknowledged to clients is not
  known to the operator (in mode Async they may have been; with a synchronous standby promoted, none were).
  Measured 0: nothing was lost, and ``dataLossPossible`` becomes false.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Measured", "measured", "promotion_loss", "recorded_gap"]


def recorded_gap(gap: int | None, possible: bool) -> int | None:
    """``lsnGapBytes`` as the record keeps it at the promotion (see the module docstring): None when not known, or
    when it is 0 as last seen while loss is possible."""
    return None if possible and gap == 0 else gap


def promotion_loss(old: str, gap: int | None, possible: bool, source: str | None = None, evidence: str = "") -> str:
    """The ``FailedOver`` Event's account of the loss, from what the promotion knew; ``source`` says who last saw
    the old primary's position (``Memory``: the operator; ``Replicas``: the replicas' WAL receivers, ``evidence``
    in words)."""
    if not possible:
        return "no acknowledged commit lost: a synchronous standby holding every acknowledged commit was promoted"
    after = f"what {old} wrote after it was last seen is measured when it rejoins (status.lastFailover.divergedBytes)"
    if gap is None:
        return f"possible data loss of unknown size: {old}'s last WAL position was not known; {after}"
    seen = "as last seen"
    if source == "Replicas":
        seen = f"as last seen by the replicas ({evidence})" if evidence else "as last seen by the replicas"
    elif source == "Memory":
        seen = "as the operator last saw it"
    if gap == 0:
        return f"possible data loss: the promoted replica had all of {old}'s WAL {seen}; {after}"
    return f"possible data loss: the promoted replica lacked {gap} bytes of {old}'s WAL {seen}; {after}"


@dataclass(frozen=True)
class Measured:
    """The rejoin's measurement, as the record and the ``FailoverLossMeasured`` Event say it."""

    gap: int
    """The record's ``lsnGapBytes`` from now on."""
    possible: bool
    """The record's ``dataLossPossible`` from now on."""
    warning: bool
    """The Event is a Warning (WAL was discarded)."""
    message: str


def measured(instance: str, diverged: int, where: str, *, possible: bool, estimated: int | None) -> Measured:
    """What the former primary's measurement (``diverged`` bytes past ``where``) tells, given what the promotion
    recorded (``possible``: loss was possible; ``estimated``: its ``lsnGapBytes``, None when it had none)."""
    gap = max(diverged, estimated or 0)
    was = f"; estimated at the promotion: {estimated} bytes" if estimated is not None else ""
    if diverged == 0:
        message = f"{instance} had written nothing {where} on its timeline: the failover lost nothing{was}"
        return Measured(gap, possible and gap > 0, warning=False, message=message)
    acknowledged = (
        "commits in it may have been acknowledged to clients (asynchronous replication)"
        if possible
        else "none of it was acknowledged: the promoted standby was synchronous"
    )
    message = (
        f"{instance} had written {diverged} bytes of WAL {where} on its old timeline, discarded when it rejoined; "
        f"{acknowledged}{was}"
    )
    return Measured(gap, possible, warning=True, message=message)
