"""The ``recovery`` entry of ``instance.json``: restore this cluster's first data from another cluster's backups.

Declared in :mod:`kanri.contract.instance_config` (the operator writes it, see :mod:`kanri.postgres.recovery`); the
instance manager reads it when its primary bootstraps an empty volume (see :mod:`kanri.instance.restore`).
"""

from __future__ import annotations

from kanri.contract.instance_config import LSN_PATTERN, RecoveryPlan

__all__ = ["LSN_PATTERN", "RecoveryPlan"]
