"""The configuration files the manager owns: ``postgresql.conf``, ``pg_hba.conf`` and the replication passfile.

The manager writes ``postgresql.conf`` entirely (no include chain): user parameters first, then the operator-managed
keys. A user parameter the contract refuses (:mod:`kanri.contract.parameters`) is never written, so the file says
exactly what is in force; which values PostgreSQL accepts is checked in :mod:`kanri.instance.conf_check`.
``postgresql.auto.conf`` (ALTER SYSTEM) is left alone. Rendering is pure; writing is atomic and reports whether
anything changed, so a converged instance never reloads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from psycopg.conninfo import make_conninfo

from kanri.contract.parameters import refusal
from kanri.instance.archive import archive_parameters
from kanri.instance.config import ClusterConfig, Credentials, Settings
from kanri.instance.tls import client_options, server_parameters

Value = str | int | float | bool

PRIMARY_TCP_USER_TIMEOUT_MS = 5000
"""How long a replica's connection to its primary may go unanswered — a connection attempt included — before the WAL
receiver drops it and tries again (libpq's ``tcp_user_timeout``; ``connect_timeout`` is not honoured by the WAL
receiver, which connects without blocking). Only the network can trip it: a busy or frozen primary's kernel still
acknowledges."""


def slot_name(instance: str) -> str:
    """The physical replication slot of an instance: its name with ``-`` as ``_`` (slot names allow ``[a-z0-9_]``)."""
    return instance.lower().replace("-", "_").replace(".", "_")


def text(value: Value) -> str:
    """A parameter's value as PostgreSQL reads it: booleans as on/off."""
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def quote(value: Value) -> str:
    """A postgresql.conf value: a single-quoted string."""
    return "'" + text(value).replace("\\", "\\\\").replace("'", "''") + "'"


DEFAULTS: dict[str, str] = {
    # pg_rewind reads the old primary's WAL back to the last checkpoint before the fork, and the fence's shutdown
    # checkpoint would otherwise recycle it: without this a rejoin after a busy five minutes always clones
    # (CloudNativePG's default too)
    "wal_keep_size": "512MB",
    # A segment is archived when it fills; on a quiet cluster a commit could stay out of the archive for hours (lost
    # with the volume). This bounds it: a segment with any WAL in it is closed and archived after 5 minutes at most
    # (CloudNativePG's default too). Ignored while archive_mode is off.
    "archive_timeout": "5min",
}
"""Written before the user parameters: a user parameter of the same name comes later in the file and wins."""


def split_parameters(config: ClusterConfig) -> tuple[dict[str, str], dict[str, str]]:
    """The user parameters the contract allows (name → value as text), and the refused ones (name → why).

    A refused parameter is never written: operator-owned and forbidden keys, bad names, multi-line values,
    preload lists naming libraries outside the allowlist (:func:`kanri.contract.parameters.refusal`)."""
    allowed: dict[str, str] = {}
    refused: dict[str, str] = {}
    for name, value in sorted(config.parameters.items()):
        if (why := refusal(name, text(value))) is None:
            allowed[name] = text(value)
        else:
            refused[name] = why
    return allowed, refused


def managed_parameters(
    settings: Settings,
    config: ClusterConfig,
    *,
    replica: bool,
    replication: Credentials | None,
    paused: bool = False,
    tls: bool = False,
) -> dict[str, str | int | bool]:
    """The operator-managed keys for this instance in its current role. A replica whose replication is ``paused``
    (:mod:`kanri.instance.replication_pause`) gets no ``primary_conninfo``, so PostgreSQL runs no WAL receiver.
    With ``tls`` (the certificate is installed, :mod:`kanri.instance.tls`) the server speaks TLS and the replica
    streams over TLS, checking the primary's name against the cluster's CA."""
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
        # a standby replies every second even when idle: the primary's isolation check counts those replies
        "wal_receiver_status_interval": "1s",
        # on every instance (a standby with archive_mode=on archives nothing), so a promotion needs no restart
        **archive_parameters(config.archive),
    }
    if tls:
        params.update(server_parameters(settings))
    if replica and not paused:
        conninfo = make_conninfo(
            host=settings.primary_host,
            port=settings.primary_port,
            user=replication.username if replication else "",
            passfile=str(settings.passfile),
            application_name=settings.name,
            # A connection to an address that no longer answers (the old primary's, on a stopped or cut-off node,
            # while -rw still routes to it: the retried SYNs keep the first one's conntrack entry) waited for TCP's
            # own retries: measured, a replica resumed just after a failover stayed unready for 60-135 s. The WAL
            # receiver tries again every 5 s (wal_retrieve_retry_interval), by then through the new primary's -rw.
            tcp_user_timeout=PRIMARY_TCP_USER_TIMEOUT_MS,
            **(client_options(settings) if tls else {}),
        )
        params["primary_conninfo"] = conninfo
    if replica:
        params["primary_slot_name"] = slot_name(settings.name)
    # On a replica too, where PostgreSQL ignores it until a promotion: the first commit a promoted replica takes
    # already waits for its synchronous standbys, before the manager has rewritten the files.
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
    settings: Settings,
    config: ClusterConfig,
    parameters: Mapping[str, str],
    *,
    replica: bool,
    replication: Credentials | None,
    paused: bool = False,
    tls: bool = False,
) -> str:
    """The whole postgresql.conf for this instance: ``parameters`` (the user's, already checked), then the managed
    keys."""
    lines = [
        "# Written by the kanri instance manager; local edits are overwritten.",
        "# User parameters come from the cluster spec; the operator-managed keys below them win.",
        "",
        "# defaults (a user parameter below overrides them)",
    ]
    lines += [f"{k} = {quote(v)}" for k, v in DEFAULTS.items() if k not in parameters]
    lines += ["", "# user parameters"]
    lines += [f"{k} = {quote(v)}" for k, v in sorted(parameters.items())]
    lines += ["", "# operator-managed"]
    managed = managed_parameters(settings, config, replica=replica, replication=replication, paused=paused, tls=tls)
    lines += [f"{k} = {quote(v)}" for k, v in managed.items()]
    return "\n".join(lines) + "\n"


def render_hba(replication: Credentials | None, *, tls: bool = False) -> str:
    """pg_hba.conf: the superuser by peer on the unix socket; over TCP, SCRAM only (replication for its user). With
    ``tls`` every TCP connection must use TLS: ``hostssl`` lines, and a plaintext one is rejected first."""
    host = "hostssl" if tls else "host   "
    lines = [
        "# Written by the kanri instance manager; local edits are overwritten.",
        "# TYPE  DATABASE     USER  ADDRESS  METHOD",
        "local   all          postgres       peer",
    ]
    if tls:
        lines.append("hostnossl all        all   all      reject")
    if replication is not None:
        lines.append(f'{host} replication  "{replication.username}"  all  scram-sha-256')
    lines.append(f"{host} all          all   all      scram-sha-256")
    return "\n".join(lines) + "\n"


def render_passfile(replication: Credentials | None) -> str:
    """A libpq passfile with the replication password for any host (``*:*:*:user:password``); also used for the
    superuser's password for pg_rewind (:mod:`kanri.instance.rejoin`)."""
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
