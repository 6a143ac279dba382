"""The cloud operator's label keys, annotations and field manager."""

from __future__ import annotations

from kanri import kit

__all__ = ["APPROVE_DOWNTIME", "FIELD_MANAGER", "FINALIZER", "LABELS"]

LABELS = kit.LabelSet("cloud.kanri.dev", "databaseinstance", owner_key="instance")
FIELD_MANAGER = "kanri-cloud-operator"
FINALIZER = LABELS.key("cleanup")
APPROVE_DOWNTIME = LABELS.key("approve-downtime")
"""``kubectl annotate dbi NAME cloud.kanri.dev/approve-downtime='<fields> at generation <n>'``: applies changes that
need downtime now (the Planned condition names the exact value), when no maintenance window is set."""
