"""How soon to look again at a database, by its state: the provider's states differ in how long they last, and a
poll is a request the budget pays for. Pure."""

from __future__ import annotations

__all__ = ["RESYNC", "poll_delay"]

RESYNC = 600.0
"""A settled database is compared with its spec again every 10 minutes (drift made outside kanri)."""

# First delay per state in seconds; each look at the same state doubles it up to the cap.
_FIRST = {"creating": 5.0, "backing-up": 5.0, "modifying": 5.0, "deleting": 5.0, "rebooting": 5.0,
          "upgrading": 10.0, "configuring-enhanced-monitoring": 10.0, "storage-optimization": 30.0,
          "maintenance": 30.0, "starting": 5.0, "stopping": 5.0}  # fmt: skip
_CAP = {"storage-optimization": 300.0, "maintenance": 300.0}


def poll_delay(state: str, looks: int, *, cap: float = 60.0) -> float:
    """Seconds until the next look at a database in ``state`` that was seen in it ``looks`` times in a row (0 the
    first time). Unknown states start at 15 s; settled (available) goes to the resync period."""
    if state == "available":
        return RESYNC
    first = _FIRST.get(state, 15.0)
    return min(_CAP.get(state, cap), first * float(2 ** min(max(looks, 0), 10)))
