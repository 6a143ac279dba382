"""Names and labels of a PostgresPooler's children (all in the pooler's namespace)."""

from __future__ import annotations

from kanri.kit import LabelSet

__all__ = ["CONFIG_HASH", "LABELS", "auth_secret", "config_map", "deployment", "service", "tls_secret"]

LABELS = LabelSet("kanri.dev", "pgbouncer", owner_key="pooler")
"""``kanri.dev/pooler: <name>`` and ``app.kubernetes.io/name: pgbouncer``: never PostgreSQL's pods or Services."""

CONFIG_HASH = LABELS.key("config-hash")
"""Pod template annotation: the hash of pgbouncer.ini and the auth file, so a change rolls the Deployment."""


def deployment(pooler: str) -> str:
    """The PgBouncer Deployment: the pooler's name."""
    return pooler


def service(pooler: str) -> str:
    """The Service clients connect to: the pooler's name."""
    return pooler


def config_map(pooler: str) -> str:
    """pgbouncer.ini."""
    return f"{pooler}-pgbouncer"


def auth_secret(pooler: str) -> str:
    """The lookup role's password (generated once) and the auth file holding it."""
    return f"{pooler}-pooler-auth"


def tls_secret(pooler: str) -> str:
    """The pooler's server certificate, issued by the cluster's CA, and that CA."""
    return f"{pooler}-pooler-tls"
