"""When a failed base backup is tried again: the pure decision behind the PostgresBackup controller's retries.

A backup attempt that failed for a reason that may pass (barman failed, e.g. the object store refused or was
unreachable; the instance did not answer) is tried again after an exponential backoff (``base``, doubling, at most
``cap``) until ``max_attempts`` attempts were made; then it is Failed for good. A refusal (the instance answered
400: the request itself is wrong) is never retried: the same request would be refused again.

Each attempt has its own idempotency key (:func:`attempt_id`): the instance answers a known key with its record, so
a retry under the first key would only read the failed record back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = ["DEFAULT", "PERMANENT", "GiveUp", "Retry", "RetryPolicy", "attempt_id", "decide"]

PERMANENT = frozenset({"BackupRefused"})
"""Failure reasons no retry can fix."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a failed backup is tried again."""

    base: timedelta = timedelta(seconds=30)
    """The wait after the first failed attempt; it doubles after each further one."""
    cap: timedelta = timedelta(minutes=10)
    """The longest wait between two attempts."""
    max_attempts: int = 5
    """Attempts in all (the first included); after the last one failed, the backup is Failed."""

    def delay(self, failed: int) -> timedelta:
        """The wait after ``failed`` attempts failed (1: ``base``)."""
        if failed <= 1:
            return min(self.base, self.cap)
        # Doubling stops once past the cap (no huge powers of two for a large count).
        wait = self.base
        for _ in range(failed - 1):
            wait *= 2
            if wait >= self.cap:
                return self.cap
        return wait


DEFAULT = RetryPolicy()
"""30 s, 1 min, 2 min, 4 min: a backup fails for good about 7.5 min after its first attempt failed."""


@dataclass(frozen=True)
class Retry:
    """Try again: attempt number ``attempt`` at ``at``."""

    attempt: int
    at: datetime


@dataclass(frozen=True)
class GiveUp:
    """Failed for good, and why no further attempt is made."""

    why: str


def decide(policy: RetryPolicy, failed: int, reason: str, now: datetime) -> Retry | GiveUp:
    """What follows the failure of attempt number ``failed`` (1-based) with ``reason``, failed at ``now``."""
    if reason in PERMANENT:
        return GiveUp(f"{reason} is not retried: the same request would be refused again")
    if failed >= policy.max_attempts:
        return GiveUp(f"all {policy.max_attempts} attempts failed")
    return Retry(attempt=failed + 1, at=now + policy.delay(failed))


def attempt_id(key: str, attempt: int) -> str:
    """The instance's idempotency key for ``attempt`` of the backup keyed ``key``: ``key`` itself for the first (as
    before retries existed, so a backup running across an operator upgrade keeps its key), ``<key>-a<n>`` after."""
    return key if attempt <= 1 else f"{key}-a{attempt}"
