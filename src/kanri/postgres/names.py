"""Deterministic names of everything the operator creates for a PostgresCluster.

Every name is a pure function of the cluster's name (and an instance number), so a reconcile finds its children
again without remembering anything and a rerun never creates a twin. The API refuses cluster names over 40
characters (``MAX_NAME_LENGTH``), so every name below stays a valid DNS-1123 label without hashing.

Names never collide between two clusters of one namespace: every child is ``<cluster>-<suffix>`` (never the bare
cluster name), and within one kind no suffix is another suffix with a ``<word>-`` prefix — otherwise cluster ``c``'s
child ``c-primary`` would be cluster ``c-primary``'s child named ``c-primary`` (as the replica budget once was).
Instance suffixes are bare numbers, which no fixed suffix is. ``tests/unit/test_postgres_names.py`` proves it.
"""

from __future__ import annotations

__all__ = [
    "api_secret",
    "app_secret",
    "ca_key_secret",
    "ca_secret",
    "config_map",
    "instance_name",
    "instance_number",
    "legacy_replica_pdb",
    "pod_name",
    "primary_pdb",
    "read_only_service",
    "read_service",
    "read_write_service",
    "replica_pdb",
    "replication_secret",
    "server_secret",
    "service_account",
    "superuser_secret",
]


def instance_name(cluster: str, number: int) -> str:
    """``<cluster>-<n>``: the instance's StatefulSet and PVC (n counts from 1)."""
    if number < 1:
        raise ValueError(f"instance numbers start at 1, got {number}")
    return f"{cluster}-{number}"


def instance_number(cluster: str, name: str) -> int | None:
    """The ``n`` of ``<cluster>-<n>``, or None when ``name`` is not an instance of ``cluster``."""
    prefix = f"{cluster}-"
    if not name.startswith(prefix):
        return None
    digits = name[len(prefix) :]
    if not digits.isdigit() or digits.startswith("0"):
        return None
    return int(digits)


def pod_name(instance: str) -> str:
    """The single pod of the instance's StatefulSet."""
    return f"{instance}-0"


def read_write_service(cluster: str) -> str:
    """Routes to the primary."""
    return f"{cluster}-rw"


def read_only_service(cluster: str) -> str:
    """Routes to the replicas."""
    return f"{cluster}-ro"


def read_service(cluster: str) -> str:
    """Routes to any instance."""
    return f"{cluster}-r"


def ca_secret(cluster: str) -> str:
    """The published CA certificate (``ca.crt``) clients verify the server with."""
    return f"{cluster}-ca"


def ca_key_secret(cluster: str) -> str:
    """The cluster's CA with its private key: read by the operator only."""
    return f"{cluster}-ca-key"


def server_secret(cluster: str) -> str:
    """The instances' server certificate (kubernetes.io/tls with ``ca.crt``)."""
    return f"{cluster}-server"


def superuser_secret(cluster: str) -> str:
    return f"{cluster}-superuser"


def replication_secret(cluster: str) -> str:
    return f"{cluster}-replication"


def app_secret(cluster: str) -> str:
    return f"{cluster}-app"


def backup_secret(cluster: str) -> str:
    """The backup repository's key pair, copied by the operator for the instances (see postgres/backup/archiving.py)."""
    return f"{cluster}-backup-credentials"


def recovery_secret(cluster: str) -> str:
    """bootstrap.recovery's source repository key pair, copied for the instances (postgres/recovery/bootstrap.py)."""
    return f"{cluster}-recovery-credentials"


def restore_test_pod(cluster: str) -> str:
    """The throwaway pod of a restore rehearsal (see postgres/recovery/rehearsal.py)."""
    return f"{cluster}-restore-test"


def api_secret(cluster: str) -> str:
    """The bearer token of the instance managers' HTTP API."""
    return f"{cluster}-api"


def config_map(cluster: str) -> str:
    return f"{cluster}-config"


def service_account(cluster: str) -> str:
    """Also the name of the instances' Role and RoleBinding."""
    return f"{cluster}-instance"


def primary_pdb(cluster: str) -> str:
    return f"{cluster}-primary"


def replica_pdb(cluster: str) -> str:
    return f"{cluster}-replicas"


def legacy_replica_pdb(cluster: str) -> str:
    """What the replica budget was called before: the bare cluster name, so cluster ``c-primary``'s replica budget
    was cluster ``c``'s primary budget. Deleted when the cluster controls one."""
    return cluster


def upgrade_check_pod(cluster: str) -> str:
    """The one-off pod of a major upgrade's ``pg_upgrade --check`` (see postgres/upgrade/step.py)."""
    return f"{cluster}-upgrade-check"


def upgrade_pod(cluster: str) -> str:
    """The one-off pod that runs ``pg_upgrade --link`` on the primary's volume (see postgres/upgrade/step.py)."""
    return f"{cluster}-upgrade"
