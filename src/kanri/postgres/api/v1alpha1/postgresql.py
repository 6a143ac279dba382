"""PostgreSQL configuration a user may set, and the parameters the operator keeps for itself.

The rules come from :mod:`kanri.contract.parameters`, the lists the instance manager checks again before it writes
``postgresql.conf``: one list, two checks, never two opinions.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kanri.contract.parameters import (
    FORBIDDEN,
    FORBIDDEN_PREFIXES,
    OPERATOR_OWNED,
    PARAMETER_NAME_PATTERN,
    PRELOAD_LIBRARIES,
    PRELOAD_LIST_PATTERN,
    PRELOAD_PARAMETERS,
    VALUE_PATTERN,
)
from kanri.postgres.api.v1alpha1._base import ApiModel, cel_list
from kanri.runtime import cel

__all__ = ["OPERATOR_OWNED_PARAMETERS", "SUPPORTED_VERSIONS", "PostgreSQL"]

SUPPORTED_VERSIONS = range(14, 19)
"""PostgreSQL majors the operator runs (14 to 18)."""

OPERATOR_OWNED_PARAMETERS = OPERATOR_OWNED
"""``postgresql.parameters`` keys the operator sets itself (the contract's list, under the name this API exported)."""

MAX_PARAMETERS = 256
MAX_VALUE_LENGTH = 4096
"""Bounds the API server's CEL cost estimate relies on (see docs/runtime-crd.md)."""


def _forbidden(key: str) -> str:
    """CEL: ``key`` is a FORBIDDEN name, or ``ssl`` / ``ssl_*`` (a FORBIDDEN_PREFIXES family)."""
    families = " || ".join(f"{key} == '{p}' || {key}.startsWith('{p}_')" for p in FORBIDDEN_PREFIXES)
    return f"{key} in {cel_list(FORBIDDEN)} || {families}"


def _keys_where(condition: str) -> str:
    """CEL: the keys ``k`` of the map for which ``condition`` holds, sorted (CEL iterates a map in no fixed order, and
    the same mistake should give the same message)."""
    return f"self.filter(k, {condition}).sort()"


_NAME = f"k.matches('{PARAMETER_NAME_PATTERN}')"
_OWNED = f"k in {cel_list(OPERATOR_OWNED)}"
_FORBIDDEN = _forbidden("k")
# CEL string literals read \r, \n and \x00 as the characters themselves; the regular expression gets them raw.
_ONE_LINE = cel(
    f"self.matches('{VALUE_PATTERN}')",
    "a parameter value must be one line without NUL: a line break would start another postgresql.conf entry",
)
# Three lookups, not a loop over the map: a regular expression over every value would cost 256 times as much.
_PRELOAD_BAD = f"k in self && !self[k].matches('{PRELOAD_LIST_PATTERN}')"
_PRELOAD = cel(
    f"{cel_list(PRELOAD_PARAMETERS)}.all(k, !({_PRELOAD_BAD}))",
    message_expression="'preload parameters may list only libraries every kanri image ships and that are meant to be "
    f"preloaded ({', '.join(PRELOAD_LIBRARIES)}), comma-separated; anything else fails at the next restart or loads "
    f"foreign code: %s'.format([{cel_list(PRELOAD_PARAMETERS)}.filter(k, {_PRELOAD_BAD})])",
    reason="FieldValueForbidden",
)


class PostgreSQL(ApiModel):
    """PostgreSQL server configuration (postgresql.conf)."""

    parameters: Annotated[
        dict[str, Annotated[str, Field(max_length=MAX_VALUE_LENGTH), _ONE_LINE]],
        Field(max_length=MAX_PARAMETERS),
        cel(
            f"self.all(k, {_NAME})",
            message_expression="'parameter names must be lower case PostgreSQL names (like work_mem or "
            f"pg_stat_statements.track): %s'.format([{_keys_where('!' + _NAME)}])",
        ),
        cel(
            f"self.all(k, !({_OWNED}))",
            message_expression="'parameters managed by the operator cannot be set: "
            f"%s'.format([{_keys_where(_OWNED)}])",
            reason="FieldValueForbidden",
        ),
        cel(
            f"self.all(k, !({_FORBIDDEN}))",
            message_expression="'parameters that read files (include*), load code (dynamic_library_path, "
            "jit_provider), configure TLS (ssl, ssl_*: the operator sets those) or give up data safety (fsync, "
            f"zero_damaged_pages, ...) cannot be set: %s'.format([{_keys_where(_FORBIDDEN)}])",
            reason="FieldValueForbidden",
        ),
        _PRELOAD,
    ] = Field(default_factory=dict)
    """postgresql.conf settings as strings, e.g. max_connections: "200", shared_buffers: 1GB. Default: PostgreSQL's
    own defaults. Changing a setting PostgreSQL can reload is applied without a restart; one that needs a restart
    restarts the instances one at a time, replicas first. Values are one line without NUL.

    Keys the operator owns (listen_addresses, port, archive_command, restore_command, primary_conninfo,
    synchronous_standby_names, wal_level, hot_standby, wal_log_hints, full_page_writes, max_wal_senders and the
    other file, recovery and logging settings) are refused by the API server with a message naming them. So are keys
    that read files (include, include_if_exists, include_dir), load code (dynamic_library_path, jit_provider),
    configure TLS (ssl and every ssl_* key) or give up data safety (fsync, zero_damaged_pages, ...).
    shared_preload_libraries, session_preload_libraries and local_preload_libraries may list only auth_delay,
    auto_explain, passwordcheck, pg_prewarm and pg_stat_statements. See docs/postgrescluster.md for the full lists."""
