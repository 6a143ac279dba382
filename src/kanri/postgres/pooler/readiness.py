"""The pooler's Ready condition from what one pass saw (pure): the first closed gate names the reason."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Observed", "Readiness", "decide"]


@dataclass(frozen=True)
class Observed:
    """What a pass found."""

    cluster: str
    cluster_exists: bool
    cluster_ready: bool
    ca_available: bool
    """The cluster's CA with its key (the operator's ``<cluster>-ca-key``): the pooler's certificate can be issued."""
    auth_confirmed: bool
    """The primary confirmed the lookup role for the current auth Secret."""
    wanted: int
    ready: int


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    message: str


def decide(seen: Observed) -> Readiness:
    """Ready only when the cluster serves, the certificate and the lookup role exist and every pod is ready."""
    if not seen.cluster_exists:
        return Readiness(False, "ClusterNotFound", f"PostgresCluster {seen.cluster} does not exist in this namespace")
    if not seen.ca_available:
        return Readiness(False, "WaitingForCA", f"the CA of PostgresCluster {seen.cluster} (its -ca-key Secret) is "
                                                "not there yet: the pooler's certificate cannot be issued")  # fmt: skip
    if not seen.auth_confirmed:
        reason = "the primary has not confirmed the pooler's lookup role yet"
        if not seen.cluster_ready:
            return Readiness(False, "ClusterNotReady", f"PostgresCluster {seen.cluster} is not ready; {reason}")
        return Readiness(False, "AuthNotConfigured", reason)
    if seen.wanted == 0:
        return Readiness(False, "Stopped", "spec.instances is 0: no PgBouncer pod runs")
    if seen.ready < seen.wanted:
        return Readiness(False, "InstancesNotReady", f"{seen.ready} of {seen.wanted} PgBouncer pods ready")
    if not seen.cluster_ready:
        return Readiness(False, "ClusterNotReady", f"PostgresCluster {seen.cluster} is not ready")
    return Readiness(True, "Ready", f"{seen.ready} PgBouncer pods ready in front of {seen.cluster}")
