"""The configuration files the manager owns: ``postgresql.conf``, ``pg_hba.conf`` and the replication passfile.

The manager writes ``postgresql.conf`` entirely (no include chain): user parameters first, then the operator-managed
keys, which win — a user parameter naming a managed key is dropped, not merely overridden, so the file says exactly
what is in force. ``postgresql.auto.conf`` (ALTER SYSTEM) is left alone. Rendering is pure; writing is atomic and
reports whether anything changed, so a converged instance never reloads.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from psycopg.conninfo import make_conninfo

from kanri.instance.config import ClusterConfig, Credentials, Settings

MANAGED_KEYS = frozenset(
    {
        "listen_addresses",
        "port",
        "unix_socket_directories",
        "hba_file",
        "ident_file",
        "data_directory",
        "config_file",
        "wal_level",
        "hot_standby",
        "max_wal_senders",
        "max_replication_slots",
        "wal_log_hints",
        "primary_conninfo",
        "primary_slot_name",
        "cluster_name",
        "synchronous_standby_names",
        "logging_collector",
        "log_destination",
        "password_encryption",
    }
)
"""Keys only the manager sets (a user parameter with one of these names is ignored and reported)."""

_NAME = re.compile(r"^[a-z_][a-z0-9_.]*$")


def slot_name(instance: str) -> str:
    """The physical replication slot of an instance: its name with ``-`` as ``_`` (slot names allow ``[a-z0-9_]``)."""
    return instance.lower().replace("-", "_").replace(".", "_")


def quote(value: str | int | float | bool) -> str:
    """A postgresql.conf value: booleans as on/off, everything else a single-quoted string."""
    text = ("on" if value else "off") if isinstance(value, bool) else str(value)
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def rejected_parameters(config: ClusterConfig) -> list[str]:
    """User parameters the manager will not write: managed keys and names that are not parameter names."""
    return sorted(k for k in config.parameters if k.lower() in MANAGED_KEYS or not _NAME.match(k.lower()))


def managed_parameters(
    settings: Settings, config: ClusterConfig, *, replica: bool, replication: Credentials | None
) -> dict[str, str | int | bool]:
    """The operator-managed keys for this instance in its current role."""
    senders = max(10, len(config.instances) + 4)  # room for clones and tools besides one sender per replica
    params: dict[str, str | int | bool] = {
        "listen_addresses": settings.pg_listen,
        "port": settings.pg_port,
        "unix_socket_directories": str(settings.socket_dir),
        "hba_file": str(settings.pgdata / "pg_hba.conf"),
        "wal_level": "replica",
        "hot_standby": True,
        "max_wal_senders": senders,
        "max_replication_slots": senders,
        "wal_log_hints": True,  # pg_rewind needs it (or data checksums) on a former primary
        "cluster_name": settings.cluster,
        "logging_collector": False,  # PostgreSQL logs to stderr, which is the container's log
        "log_destination": "stderr",
        "password_encryption": "scram-sha-256",
    }
    if replica:
        conninfo = make_conninfo(
            host=settings.primary_host,
            port=settings.primary_port,
            user=replication.username if replication else "",
            passfile=str(settings.passfile),
            application_name=settings.name,
        )
        params["primary_conninfo"] = conninfo
        params["primary_slot_name"] = slot_name(settings.name)
    else:
        params["synchronous_standby_names"] = synchronous_standby_names(settings.name, config)
    return params


def synchronous_standby_names(name: str, config: ClusterConfig) -> str:
    """``ANY n ("a", "b")`` over the other instances, n capped at their number; empty when none is asked for."""
    others = [i for i in config.instances if i != name]
    wanted = min(config.synchronous_standbys, len(others))
    if wanted == 0:
        return ""
    return f"ANY {wanted} (" + ", ".join(f'"{i}"' for i in others) + ")"


def render_postgresql_conf(
    settings: Settings, config: ClusterConfig, *, replica: bool, replication: Credentials | None
) -> str:
    """The whole postgresql.conf for this instance."""
    rejected = set(rejected_parameters(config))
    lines = [
        "# Written by the kanri instance manager; local edits are overwritten.",
        "# User parameters come from the cluster spec; the operator-managed keys below them win.",
        "",
        "# user parameters",
    ]
    lines += [f"{k.lower()} = {quote(v)}" for k, v in sorted(config.parameters.items()) if k not in rejected]
    lines += ["", "# operator-managed"]
    managed = managed_parameters(settings, config, replica=replica, replication=replication)
    lines += [f"{k} = {quote(v)}" for k, v in managed.items()]
    return "\n".join(lines) + "\n"


def render_hba(replication: Credentials | None) -> str:
    """pg_hba.conf: the superuser by peer on the unix socket; over TCP, SCRAM only (replication for its user)."""
    lines = [
        "# Written by the kanri instance manager; local edits are overwritten.",
        "# TYPE  DATABASE     USER  ADDRESS  METHOD",
        "local   all          postgres       peer",
    ]
    if replication is not None:
        lines.append(f'host    replication  "{replication.username}"  all  scram-sha-256')
    lines.append("host    all          all   all      scram-sha-256")
    return "\n".join(lines) + "\n"


def render_passfile(replication: Credentials | None) -> str:
    """A libpq passfile with the replication password for any host (``*:*:*:user:password``)."""
    if replication is None:
        return ""

    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace(":", "\\:")

    return f"*:*:*:{escape(replication.username)}:{escape(replication.password)}\n"


def write_if_changed(path: Path, text: str, mode: int = 0o600) -> bool:
    """Write ``text`` to ``path`` atomically (temp file + rename) unless it is there already; True if written."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)
    return True
