"""A replica leaves ``<name>-ro`` by itself once its server has not heard from its primary for longer than
``readPolicy.maxLagSeconds``, also while the operator is down; the operator's pass alone puts a pod back (it alone
knows the bytes bound, from the primary's offset).

The operator tells each pod its seconds bound in an annotation (:data:`MAX_LAG_SECONDS`, absent when reads go to the
primary or the policy states no seconds bound) and the agent reads it from the look at its own pod it takes anyway
(:attr:`~kanri.cache.agent.labels.PodLabel.seen`: the role label's read-back every few seconds, or a label write's
answer), so a new ``readPolicy`` reaches a running agent without a restart and costs no request of its own.

Both sides judge a replica by the same number (:func:`within_bound` of ``master_last_io_seconds_ago``), so the
operator never adds back a pod its agent would withdraw. One window is left: the operator's look at the server
may be older than the agent's, and its write later (its probes and writes take a moment). So a withdrawal marks the
pod with the server's replication position (:data:`WITHDRAWN_AT`: replication id and offset, which only grow while
it replicates), and the operator adds the pod back only from a look taken after it (:func:`seen_after`); its label
write is conditional on the pod's resourceVersion, so a withdrawal that lands between its read and its write wins.

Stdlib only, like :mod:`kanri.cache.agent.labels`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from kanri.cache.agent.fencing import History
from kanri.cache.agent.labels import RETRY_AFTER, LabelError, PodLabel

__all__ = [
    "MAX_LAG_SECONDS",
    "READABLE",
    "WITHDRAWN_AT",
    "ReadGuard",
    "bound_of",
    "must_withdraw",
    "seen_after",
    "withdrawal_mark",
    "within_bound",
]

log = structlog.get_logger("kanri.cache.agent")

READABLE = "cache.kanri.dev/readable"
"""The pod label ``<name>-ro`` selects (``"true"``)."""
MAX_LAG_SECONDS = "cache.kanri.dev/max-lag-seconds"
"""The pod annotation with ``readPolicy.maxLagSeconds`` (whole seconds), kept by the operator."""
WITHDRAWN_AT = "cache.kanri.dev/withdrawn-at"
"""The pod annotation an agent writes as it withdraws its pod: ``<replication id>:<offset>`` of its server then."""


def within_bound(seconds: int | None, bound: int) -> bool:
    """A replica silent for ``seconds`` (None: never linked) may serve reads under a bound of ``bound`` seconds: the
    one rule of the operator (:func:`kanri.cache.observe.readable_replica`) and the agent."""
    return seconds is not None and seconds <= bound


def bound_of(metadata: Mapping[str, Any]) -> int | None:
    """The seconds bound the operator gave the pod (None: none, or not a whole number of seconds)."""
    text = (metadata.get("annotations") or {}).get(MAX_LAG_SECONDS)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def must_withdraw(me: History | None, bound: int | None) -> bool:
    """Whether this pod may no longer serve reads: its server is a replica past the bound, link up or down. A
    primary never withdraws (``-ro`` falls back to it); nor does a pod whose server did not answer (the operator's
    pass removes a pod it cannot reach) or that was given no bound."""
    if me is None or me.role != "replica" or bound is None:
        return False
    return not within_bound(me.silent_seconds, bound)


def withdrawal_mark(me: History) -> str:
    return f"{me.replid}:{me.offset}"


def seen_after(mark: str | None, seen: History) -> bool:
    """Whether ``seen`` (the operator's look at the pod's server) was taken after the withdrawal ``mark``
    (:data:`WITHDRAWN_AT`; None: never withdrawn): a new replication id (it follows another primary, or leads), or
    the same one further on. While its primary is frozen, a replica's offset stands still, so no look passes."""
    if mark is None:
        return True
    replid, _, offset = mark.rpartition(":")
    try:
        return seen.replid != replid or seen.offset > int(offset)
    except ValueError:  # not an agent's mark: no reason to keep the pod out
        return True


@dataclass
class ReadGuard:
    """Withdraws its pod from ``-ro`` (removes :data:`READABLE`, writes :data:`WITHDRAWN_AT`) once per spell past the
    bound, and again if a later look at the pod finds the label back; in the background, like
    :meth:`PodLabel.offer <kanri.cache.agent.labels.PodLabel.offer>`, so the fencing loop never waits."""

    label: PodLabel
    """The role label's keeper: its API access and its last look at the pod."""
    clock: Callable[[], float] = time.monotonic
    withdrawn: bool = False
    """This spell past the bound has withdrawn the pod."""
    retry_at: float = float("-inf")
    in_flight: asyncio.Task[None] | None = field(default=None, repr=False)

    def offer(self, me: History | None) -> None:
        """Called every round with the server's history (None: it did not answer); returns at once."""
        seen = self.label.seen
        if not must_withdraw(me, bound_of(seen)):
            self.withdrawn = False
            return
        assert me is not None
        still_in = (seen.get("labels") or {}).get(READABLE) is not None
        busy = self.in_flight is not None and not self.in_flight.done()
        if (self.withdrawn and not still_in) or busy or self.clock() < self.retry_at:
            return
        self.in_flight = asyncio.create_task(self.withdraw(me, bound_of(seen)))

    async def withdraw(self, me: History, bound: int | None) -> None:
        """One PATCH; never raises (a failure is tried again after :data:`RETRY_AFTER` s)."""
        metadata = {"labels": {READABLE: None}, "annotations": {WITHDRAWN_AT: withdrawal_mark(me)}}
        try:
            await self.label.patch(metadata)
        except LabelError as exc:
            self.retry_at = self.clock() + RETRY_AFTER
            log.warning("could not withdraw the pod from -ro", error=str(exc))
            return
        except Exception:  # a background task's error would otherwise vanish
            self.retry_at = self.clock() + RETRY_AFTER
            log.exception("could not withdraw the pod from -ro")
            return
        self.withdrawn = True
        log.warning("withdrew the pod from -ro: its primary is silent past the bound", silent_seconds=me.silent_seconds,
                    bound_seconds=bound, link_up=me.link_up)  # fmt: skip
