"""The status fields the kit writes, for an operator's status model to inherit (the API server prunes what a CRD's
schema does not declare, so a kit record missing from it would vanish without a trace)."""

from __future__ import annotations

from pydantic import Field

from kanri.kit._requests import Acknowledgement
from kanri.runtime import Conditions, KubeModel

__all__ = ["KitStatus"]


class KitStatus(KubeModel):
    """Base of an operator's status model: ``class StoreStatus(KitStatus): keys: int | None = None``."""

    observed_generation: int | None = None
    """The metadata.generation the operator last acted on."""
    conditions: Conditions = Field(default_factory=list)
    """Ready, Degraded (the problems found) and the operator's own."""
    requests: dict[str, Acknowledgement] = Field(default_factory=dict)
    """The last request of each name the operator handled (kanri.kit requests and approvals)."""
    one_shot_pods: dict[str, str] = Field(default_factory=dict)
    """Name -> uid of each one-shot pod the operator created and has not cleared (only these are trusted)."""
