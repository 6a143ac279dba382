"""pgbouncer.ini for one PostgresPooler (pure), and the hash that rolls its pods when anything they read changes.

The operator owns listening, authentication, TLS and the users (:data:`OWNED`); ``spec.parameters`` may set only
what the API allows (``USER_PARAMETERS``) and overrides :data:`DEFAULTS`. The ``[databases]`` section has one
fallback entry, ``*``: every database a client names goes to the cluster's Service under that name, and the lookup
function (:mod:`kanri.contract.pooler`) is called in that database.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from kanri.contract.pooler import AUTH_QUERY, POOLER_ROLE
from kanri.postgres import names as pg_names
from kanri.postgres.api.v1alpha1.postgres_pooler import USER_PARAMETERS, PostgresPoolerSpec

__all__ = [
    "AUTH_DIR",
    "AUTH_FILE",
    "CONFIG_DIR",
    "CONFIG_FILE",
    "DEFAULTS",
    "PORT",
    "TLS_DIR",
    "Target",
    "auth_file",
    "config_hash",
    "owned",
    "render",
    "target",
]

PORT = 5432
CONFIG_DIR = "/etc/pgbouncer/config"
CONFIG_FILE = "pgbouncer.ini"
AUTH_DIR = "/etc/pgbouncer/auth"
AUTH_FILE = "userlist.txt"
TLS_DIR = "/etc/pgbouncer/tls"

DEFAULTS: dict[str, str] = {
    "max_client_conn": "1000",
    "default_pool_size": "20",
    # after a failed server login (the primary going, -rw without endpoints) try again in a quarter of a second, not
    # PgBouncer's 15 s: a switchover then costs pooled clients about what it costs clients that reconnect at once
    "server_login_retry": "0.25",
    "server_connect_timeout": "5",
    "query_wait_timeout": "120",
    # a server (or client) that stops answering at the TCP level (its node down or cut off, its pod gone) is failed
    # by the kernel within seconds, not after Linux's 2 h 11 min: a keepalive probe after 5 s of silence, then every
    # 2 s, and the connection closed once data or probes stay unacknowledged for 10 s (TCP_USER_TIMEOUT also bounds
    # keepalive). A healthy server's kernel acknowledges at once, however long its query runs. A server whose
    # processes froze on a live kernel is the agent's to end (agent.stranded).
    "tcp_keepalive": "1",
    "tcp_keepidle": "5",
    "tcp_keepintvl": "2",
    "tcp_keepcnt": "3",
    "tcp_user_timeout": "10000",
    # JDBC and others send it; PgBouncer would refuse the connection otherwise
    "ignore_startup_parameters": "extra_float_digits",
}
"""What a pooler runs with unless ``spec.parameters`` says otherwise."""


@dataclass(frozen=True)
class Target:
    """Where PgBouncer connects: the cluster's Service, by the name its certificate carries (verify-full)."""

    host: str
    port: int = 5432


def target(cluster: str, namespace: str, service_type: str) -> Target:
    """The ``-rw`` or ``-ro`` Service of ``cluster`` as ``<service>.<namespace>.svc``."""
    service = pg_names.read_write_service(cluster) if service_type == "rw" else pg_names.read_only_service(cluster)
    return Target(f"{service}.{namespace}.svc")


def owned(mode: str) -> dict[str, str]:
    """The settings the operator owns (never the user's): listening, auth through the lookup role, TLS both ways."""
    return {
        "listen_addr": "0.0.0.0",
        "listen_port": str(PORT),
        "unix_socket_dir": "",
        "pool_mode": mode,
        "auth_type": "scram-sha-256",
        "auth_file": f"{AUTH_DIR}/{AUTH_FILE}",
        "auth_user": POOLER_ROLE,
        "auth_query": AUTH_QUERY,
        # the agent's RECONNECT after the primary moved (agent.primary_watch); the role's password is the
        # operator's alone, and whoever has it can read verifiers through the lookup already
        "admin_users": POOLER_ROLE,
        "stats_users": POOLER_ROLE,
        "client_tls_sslmode": "require",
        "client_tls_cert_file": f"{TLS_DIR}/tls.crt",
        "client_tls_key_file": f"{TLS_DIR}/tls.key",
        "client_tls_ca_file": f"{TLS_DIR}/ca.crt",
        "server_tls_sslmode": "verify-full",
        "server_tls_ca_file": f"{TLS_DIR}/ca.crt",
    }


def _line(key: str, value: str) -> str:
    return f"{key} = {value}"


def render(spec: PostgresPoolerSpec, namespace: str) -> str:
    """pgbouncer.ini: the fallback database to the cluster's Service, then defaults, user parameters, owned ones."""
    where = target(spec.cluster, namespace, spec.type)
    user = {k: v for k, v in sorted(spec.parameters.items()) if k in USER_PARAMETERS}  # the API refused the rest
    settings = {**DEFAULTS, **user, **owned(spec.mode)}
    lines = [
        "; Written by the kanri operator from the PostgresPooler; edits are overwritten.",
        "[databases]",
        _line("*", f"host={where.host} port={where.port}"),
        "",
        "[pgbouncer]",
        *(_line(k, v) for k, v in settings.items()),
    ]
    return "\n".join(lines) + "\n"


def auth_file(password: str) -> str:
    """The auth file: the lookup role alone, with its password (PgBouncer needs it to log in as ``auth_user``)."""
    escaped = password.replace('"', '""')
    return f'"{POOLER_ROLE}" "{escaped}"\n'


def config_hash(files: Mapping[str, bytes]) -> str:
    """One hash over every file the pods read (name and content): a change of any rolls the Deployment."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()[:16]
