"""Which ``postgresql.conf`` keys a user may set through ``spec.postgresql.parameters``, and how.

Three lists, one place (the API's CEL rules and the instance manager's own check are both built from them):

- :data:`OPERATOR_OWNED` — keys the instance manager writes itself (paths, replication wiring, WAL archiving and
  recovery, logging to stderr). A user value would break replication, failover or backups.
- :data:`FORBIDDEN` — keys that make the server read a file, load code, or give up data safety. A namespace user
  who may edit a PostgresCluster must not be able to read the instance's Secrets through PostgreSQL's error messages
  (``include_if_exists: /etc/kanri/superuser/password`` once printed the password in the log), load a library of
  their choice, or tell the server to ignore damaged pages. TLS (``ssl`` and every ``ssl_*`` key) belongs to the
  operator too: it reads key files and may run a passphrase command.
- :data:`PRELOAD_LIBRARIES` — the only names ``*_preload_libraries`` may list: libraries every kanri PostgreSQL
  image ships that are meant to be preloaded. Anything else fails at the next restart or loads foreign code.

Values are single lines without NUL (a newline would start a new ``postgresql.conf`` entry).
"""

from __future__ import annotations

import re

__all__ = [
    "FORBIDDEN",
    "FORBIDDEN_PREFIXES",
    "OPERATOR_OWNED",
    "PARAMETER_NAME_PATTERN",
    "PRELOAD_LIBRARIES",
    "PRELOAD_LIST_PATTERN",
    "PRELOAD_PARAMETERS",
    "VALUE_PATTERN",
    "forbidden",
    "refusal",
]

OPERATOR_OWNED: tuple[str, ...] = tuple(
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
            "max_wal_senders",
            "max_replication_slots",
            # Streaming replicas, pg_rewind and failover rely on these values.
            "wal_level",
            "hot_standby",
            "wal_log_hints",
            "full_page_writes",
            # Passwords are stored as SCRAM verifiers the instance manager computes.
            "password_encryption",
            # The instance manager reads the server's log from stderr.
            "logging_collector",
            "log_destination",
        }
    )
)
"""Keys the operator sets itself; refused with a message saying the operator manages them."""

FORBIDDEN: tuple[str, ...] = tuple(
    sorted(
        {
            # Read another file into the configuration (and echo its content in the error when it does not parse).
            "include",
            "include_if_exists",
            "include_dir",
            # Load code from a path or a provider of the user's choosing.
            "dynamic_library_path",
            "jit_provider",
            # Read key files, run commands, write files, change who may reach the socket.
            "krb_server_keyfile",
            "stats_temp_directory",
            "log_directory",
            "log_filename",
            "unix_socket_group",
            "unix_socket_permissions",
            "event_source",
            # Give up data safety silently: damaged pages zeroed, checksum failures ignored, catalogs writable.
            "zero_damaged_pages",
            "ignore_checksum_failure",
            "ignore_invalid_pages",
            "ignore_system_indexes",
            "allow_system_table_modifications",
            "allow_in_place_tablespaces",
            "fsync",
        }
    )
)
"""Keys that read files, load code or give up data safety; refused for everyone."""

FORBIDDEN_PREFIXES: tuple[str, ...] = ("ssl",)
"""``ssl`` and ``ssl_*``: TLS is the operator's (key files, passphrase commands)."""

PRELOAD_PARAMETERS: tuple[str, ...] = (
    "local_preload_libraries",
    "session_preload_libraries",
    "shared_preload_libraries",
)

PRELOAD_LIBRARIES: tuple[str, ...] = ("auth_delay", "auto_explain", "passwordcheck", "pg_prewarm", "pg_stat_statements")
"""Libraries every kanri PostgreSQL image (14 to 18) ships and that are meant for preloading."""

PARAMETER_NAME_PATTERN = "^[a-z_][a-z0-9_$]*([.][a-z_][a-z0-9_$]*)?$"
"""Lower-case PostgreSQL names; custom (extension) parameters have one dot: ``pg_stat_statements.track``."""

VALUE_PATTERN = "^[^\\r\\n\\x00]*$"
"""One line, no NUL."""

_LIBRARY = "(" + "|".join(PRELOAD_LIBRARIES) + ")"
_ITEM = f'[ ]*({_LIBRARY}|"{_LIBRARY}")[ ]*'
PRELOAD_LIST_PATTERN = f"^({_ITEM}(,{_ITEM})*)?[ ]*$"
"""A comma-separated list of :data:`PRELOAD_LIBRARIES` names (each optionally double-quoted), or empty."""

_NAME_RE = re.compile(PARAMETER_NAME_PATTERN)
_VALUE_RE = re.compile(VALUE_PATTERN)
_PRELOAD_RE = re.compile(PRELOAD_LIST_PATTERN)


def forbidden(name: str) -> bool:
    """Whether ``name`` reads files, loads code, gives up data safety or configures TLS."""
    return name in FORBIDDEN or any(name == p or name.startswith(p + "_") for p in FORBIDDEN_PREFIXES)


def refusal(name: str, value: str) -> str | None:
    """Why the user parameter ``name = value`` may not be written, or None when it may. Never quotes ``value``
    (it may be anything a user typed, including a secret)."""
    if not _NAME_RE.match(name):
        return "not a lower-case PostgreSQL parameter name"
    if name in OPERATOR_OWNED:
        return "managed by the operator"
    if forbidden(name):
        return "refused: it reads files, loads code, configures TLS or gives up data safety"
    if not _VALUE_RE.match(value):
        return "value must be one line without NUL"
    if name in PRELOAD_PARAMETERS and not _PRELOAD_RE.match(value):
        return f"may list only libraries the image ships: {', '.join(PRELOAD_LIBRARIES)}"
    return None
