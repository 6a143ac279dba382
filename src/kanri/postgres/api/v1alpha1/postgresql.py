"""PostgreSQL configuration a user may set, and the parameters the operator keeps for itself."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kanri.postgres.api.v1alpha1._base import ApiModel
from kanri.runtime import cel

__all__ = ["OPERATOR_OWNED_PARAMETERS", "SUPPORTED_VERSIONS", "PostgreSQL"]

SUPPORTED_VERSIONS = range(14, 19)
"""PostgreSQL majors the operator runs (14 to 18)."""

OPERATOR_OWNED_PARAMETERS: tuple[str, ...] = tuple(
    sorted(
        {
            # Where PostgreSQL listens and keeps its files: the pod layout and the Services depend on them.
            "listen_addresses",
            "port",
            "unix_socket_directories",
            "data_directory",
            "config_file",
            "hba_file",
            "ident_file",
            "external_pid_file",
            # WAL archiving and recovery: written from spec.backup and spec.bootstrap.recovery.
            "archive_mode",
            "archive_command",
            "archive_library",
            "archive_cleanup_command",
            "restore_command",
            "recovery_end_command",
            "recovery_target",
            "recovery_target_action",
            "recovery_target_inclusive",
            "recovery_target_lsn",
            "recovery_target_name",
            "recovery_target_time",
            "recovery_target_timeline",
            "recovery_target_xid",
            "promote_trigger_file",
            # Replication wiring: rewritten on every failover (a stale value hangs writes or follows the old primary).
            "primary_conninfo",
            "primary_slot_name",
            "synchronous_standby_names",
            "cluster_name",
            # Streaming replicas, pg_rewind and failover rely on these values.
            "wal_level",
            "hot_standby",
            "wal_log_hints",
            "full_page_writes",
            # The instance manager reads the server's log from stderr.
            "logging_collector",
            "log_destination",
        }
    )
)
"""``postgresql.parameters`` keys the operator sets itself; the API server refuses them (naming the keys)."""

_OWNED = "[" + ", ".join(f"'{name}'" for name in OPERATOR_OWNED_PARAMETERS) + "]"
# PostgreSQL names are case-insensitive; requiring lower case (as postgresql.conf is written) keeps the check exact.
# Custom (extension) parameters have one dot: pg_stat_statements.track.
_NAME = "^[a-z_][a-z0-9_$]*([.][a-z_][a-z0-9_$]*)?$"


class PostgreSQL(ApiModel):
    """PostgreSQL server configuration (postgresql.conf)."""

    parameters: Annotated[
        dict[str, Annotated[str, Field(max_length=4096, pattern=r"^[^\r\n]*$")]],
        Field(max_length=256),
        cel(
            f"self.all(k, k.matches('{_NAME}'))",
            message_expression="'parameter names must be lower case PostgreSQL names (like work_mem or "
            f"pg_stat_statements.track): %s'.format([self.filter(k, !k.matches('{_NAME}')).sort()])",
        ),
        cel(
            f"self.all(k, !(k in {_OWNED}))",
            message_expression=f"'parameters managed by the operator cannot be set: %s'.format([self.filter(k, k in "
            f"{_OWNED}).sort()])",
            reason="FieldValueForbidden",
        ),
    ] = Field(default_factory=dict)
    """postgresql.conf settings as strings, e.g. max_connections: "200", shared_buffers: 1GB. Default: PostgreSQL's
    own defaults. Changing a setting PostgreSQL can reload is applied without a restart; one that needs a restart
    restarts the instances one at a time, replicas first. Keys the operator owns (listen_addresses, port,
    archive_command, restore_command, primary_conninfo, synchronous_standby_names, wal_level, hot_standby,
    wal_log_hints, full_page_writes and the other file, recovery and logging settings) are refused by the API server
    with a message naming them."""
