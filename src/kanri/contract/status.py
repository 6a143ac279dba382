"""The body of an instance manager's ``GET /status``, declared once for both sides.

The instance manager builds an :class:`InstanceStatus` and sends :meth:`InstanceStatus.as_json`; the operator reads
the body with :meth:`InstanceStatus.read`. Python names are snake_case, the wire is camelCase (``write_lsn`` is
``writeLsn``), except ``pending_lowers`` (``pendingRestartLowers``).

Which keys are on the wire is part of the contract (an old operator reads a new instance and the other way round
during an upgrade): a key the instance always sends is set, even to ``None``; a key that only some states have
(``fencedSince``/``fenceReason`` while fenced, ``writeLsn``/``flushLsn``/``replicas`` on a running primary,
``receiveLsn``/``replayLsn``/``lagBytes``/``streaming`` on a running replica) is left unset and so not sent.

Reading is defensive: the operator must not trust what comes over the network. :meth:`InstanceStatus.read` answers
None for a body that is not a report at all (no ``name``, a ``role`` other than primary or replica); within a
report, a value of the wrong type or out of range reads as absent, text is cut to one line of
:data:`~kanri.contract.problems.MAX_MESSAGE` characters, at most :data:`MAX_LISTED` problems and parameter names are
kept, and a problem reason the operator does not know reads as ``InstanceProblem``. Building one on the instance
side checks types only, so what the instance sends is exactly what it built.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass

from kanri.contract.problems import REASONS, one_line
from kanri.contract.wire import UNTRUSTED, Count, Flag, Name, Text, Wire, count, reading, text, untrusted

__all__ = [
    "MAX_LISTED",
    "UNKNOWN_REASON",
    "Archiver",
    "Divergence",
    "InstanceStatus",
    "Isolation",
    "Problem",
    "Rejoin",
    "Replica",
    "Restore",
    "Upstream",
]

MAX_LISTED = 16
"""The most problems (and pending parameter names) the operator keeps from one report: a misbehaving instance must
not fill the cluster's status."""

UNKNOWN_REASON = "InstanceProblem"
"""How the operator reads a problem reason that is not one of :data:`~kanri.contract.problems.REASONS`."""

_LSN = re.compile(r"[0-9A-F]{1,8}/[0-9A-F]{1,8}")
_MAX_PARAMETER = 63  # PostgreSQL's NAMEDATALEN - 1
_MAX_SYSTEM_IDENTIFIER = 20  # a uint64 in decimal

SystemIdentifier = Annotated[
    str | None,
    # a uint64 printed in decimal; JSON numbers lose precision above 2**53, hence a string
    reading(lambda v: v if isinstance(v, str) and v.isdigit() and len(v) <= _MAX_SYSTEM_IDENTIFIER else None),
]


class _Wire(Wire):
    """:class:`~kanri.contract.wire.Wire`, sending only the keys that were set (see the module docstring)."""

    def as_json(self) -> dict[str, Any]:
        """The JSON body: camelCase keys, only the keys that were set."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _none(value: Any) -> bool:
    return value is None


@dataclass(frozen=True)
class Problem:
    """One thing the user must fix that the instance found (``problems[]``): a reason from
    :data:`~kanri.contract.problems.REASONS`, a one-line message that never holds a Secret's or a file's content,
    and what it is about. Optional fields are sent only when set. (A dataclass, not a model: both sides build it
    positionally, ``Problem("Fenced", "...")``.)"""

    reason: str
    message: str
    secret: Text = Field(default=None, exclude_if=_none)
    """The credential's purpose (``superuser``, ``replication``, ``app``, ``api``) for InvalidSecret."""
    key: Text = Field(default=None, exclude_if=_none)
    """The Secret's key for InvalidSecret."""
    parameter: Text = Field(default=None, exclude_if=_none)
    """The ``postgresql.conf`` key for InvalidParameter."""

    def as_json(self) -> dict[str, str]:
        """The ``/status`` form: optional fields only when set."""
        body: dict[str, str] = _PROBLEM.dump_python(self, mode="json")
        return body

    @field_validator("reason")
    @classmethod
    def _known_reason(cls, value: str, info: ValidationInfo) -> str:
        if value in REASONS:
            return value
        if untrusted(info):
            return UNKNOWN_REASON
        raise ValueError(f"unknown problem reason {value!r} (add it to kanri.contract.problems.REASONS)")

    @field_validator("message")
    @classmethod
    def _one_line(cls, value: str) -> str:
        return one_line(value)


_PROBLEM = TypeAdapter(Problem)


class Archiver(_Wire):
    """``archiver``: the primary's ``pg_stat_archiver`` (counts since the last stats reset, times ISO 8601). A
    failure newer than the last success means the archiver is stuck on that segment."""

    mode: Text = None
    """``archive_mode``."""
    archived_count: Count = None
    last_archived_wal: Text = None
    last_archived_time: Text = None
    failed_count: Annotated[int, reading(lambda v: count(v) or 0)] = 0
    last_failed_wal: Text = None
    last_failed_time: Text = None


class Divergence(_Wire):
    """WAL a former primary wrote on ``timeline`` past the new timeline's ``switchpoint``, up to ``end``
    (``bytes``), measured before its rewind or clone."""

    timeline: Count = None
    switchpoint: Annotated[str | None, reading(lambda v: v if isinstance(v, str) and _LSN.fullmatch(v) else None)] = (
        None
    )
    end: Name = None
    bytes: Count = None


class Rejoin(_Wire):
    """``rejoin``: the last ``POST /rejoin`` (None: never asked)."""

    state: Literal["running", "done", "failed"]
    method: Annotated[Literal["rewind", "clone"] | None, reading(lambda v: v if v in ("rewind", "clone") else None)] = (
        None
    )
    message: Text = None
    divergence: Divergence | None = Field(default=None, exclude_if=_none)

    @field_validator("divergence", mode="before")
    @classmethod
    def _divergence(cls, value: Any, info: ValidationInfo) -> Any:
        return value if isinstance(value, dict | Divergence) or not untrusted(info) else None


class Replica(_Wire):
    """``replicas[]`` on a primary: one row of ``pg_stat_replication`` (no conninfo)."""

    name: str | None
    state: str | None
    sent_lsn: str | None
    flush_lsn: str | None
    replay_lsn: str | None
    lag_bytes: int | None
    sync_state: str | None


class Isolation(_Wire):
    """``isolation`` (only while the isolation check is on): when the manager last heard from the API server or a
    standby, and which (``apiserver``, ``standby``)."""

    last_contact: str | None
    via: str | None


class Restore(_Wire):
    """``restore``: ``bootstrap.recovery``'s progress on a new cluster's first primary."""

    state: str
    plan: str
    message: str


def _age(value: Any) -> float | None:
    """Seconds of age: a finite, non-negative number (not a bool), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        return None
    return float(value)


class Upstream(_Wire):
    """``upstream`` on a replica (kanri:upstream-evidence): the primary's WAL end as its WAL receiver last heard it
    (``pg_stat_wal_receiver.latest_end_lsn``, or what it received when higher), remembered by the instance manager
    because the row vanishes when the receiver stops. Ages are the replica's own clock at the report:
    ``heard_seconds`` since the last message from the primary, ``streaming_seconds`` since the receiver was last
    seen streaming (0: it streams now)."""

    position: Annotated[str | None, reading(lambda v: v if isinstance(v, str) and _LSN.fullmatch(v) else None)] = None
    timeline: Count = None
    """The timeline it was receiving: only evidence of the primary of that timeline."""
    heard_seconds: Annotated[float | None, reading(_age)] = None
    streaming_seconds: Annotated[float | None, reading(_age)] = None


def _problems(value: Any) -> Any:
    """Keep at most :data:`MAX_LISTED` problems that are objects with a message."""
    if not isinstance(value, list | tuple):
        return ()
    return [p for p in value[:MAX_LISTED] if isinstance(p, Problem) or (isinstance(p, dict) and text(p.get("message")))]


def _names(value: Any) -> Any:
    """A short list of parameter names (anything else in it is ignored)."""
    if not isinstance(value, list | tuple):
        return ()
    return [v for v in value[:MAX_LISTED] if isinstance(v, str) and 0 < len(v) <= _MAX_PARAMETER]


class InstanceStatus(_Wire):
    """What one instance manager says about itself (``GET /status``).

    The fields are declared in the order the instance has always sent them; the operator reads ``name``, ``role``,
    readiness, positions, versions, problems, fencing, the pause, ``rejoin`` and ``archiver``."""

    name: str
    role: str
    """``primary`` or ``replica`` (PostgreSQL in recovery or not); while the data directory is being prepared, the
    bootstrap mode. :meth:`read` takes only ``primary`` or ``replica`` for a report."""
    in_recovery: bool | None = None
    timeline: Count = None
    system_identifier: SystemIdentifier = None
    """The data directory's ``pg_control`` system identifier (a decimal string): one per cluster, kept by clones."""
    postgres_version: str | None = None
    connections: int | None = None
    """Client backends other than the manager's own."""
    pending_restart: Annotated[bool | None, reading(lambda v: v is True)] = False
    """Parameters wait for a restart (None from the instance while PostgreSQL is down; read as False)."""
    config_errors: list[str] | None = None
    archiver: Archiver | None = None
    """``pg_stat_archiver``; None when PostgreSQL is down."""
    running: Flag = False
    ready: Flag = False
    restart_count: int = 0
    last_error: Name = None
    data_version: Count = None
    """The major of the data directory (``PG_VERSION``), reported even when PostgreSQL cannot start."""
    binary_version: Count = None
    """The major of the PostgreSQL binaries the pod runs."""
    problems: tuple[Problem, ...] = ()
    fenced: Flag = False
    """The instance holds a fence marker: its PostgreSQL is kept stopped (``POST /fence``)."""
    replication_paused: Flag = False
    """Its WAL receiver is paused for a failover's election (``POST /replication/pause``)."""
    rejoin: Rejoin | None = None
    isolation: Isolation | None = None
    restore: Restore | None = None
    upstream: Upstream | None = None
    """A replica's remembered evidence of its primary's WAL end (sent only when it has some; an older instance
    manager never sends it: no evidence)."""
    fenced_since: str | None = None
    """Sent with ``fenceReason`` while fenced only."""
    fence_reason: Text = None
    pending_lowers: tuple[str, ...] = Field(
        default=(), validation_alias="pendingRestartLowers", serialization_alias="pendingRestartLowers"
    )
    """Standby limits (``max_connections``, ...) waiting for a restart with a lower value: the primary goes first.
    Sent, like the positions below, while PostgreSQL answers."""
    receive_lsn: Name = None
    """A replica's."""
    replay_lsn: Name = None
    lag_bytes: Count = None
    streaming: bool | None = None
    write_lsn: Name = None
    """A primary's."""
    flush_lsn: Name = None
    replicas: tuple[Replica, ...] | None = None

    @model_validator(mode="before")
    @classmethod
    def _declared_keys_only(cls, data: Any, info: ValidationInfo) -> Any:
        """The instance sends only what the contract declares (a newer peer's extra keys are ignored on reading)."""
        if not untrusted(info) and isinstance(data, dict):
            fields = cls.model_fields.items()
            known = {n for name, f in fields for n in (name, f.alias, f.validation_alias) if isinstance(n, str)}
            if unknown := set(data) - known:
                raise ValueError(f"not in the /status contract: {sorted(unknown)}")
        return data

    @field_validator("problems", mode="before")
    @classmethod
    def _some_problems(cls, value: Any, info: ValidationInfo) -> Any:
        return _problems(value) if untrusted(info) else value

    @field_validator("pending_lowers", mode="before")
    @classmethod
    def _some_names(cls, value: Any, info: ValidationInfo) -> Any:
        return _names(value) if untrusted(info) else value

    @field_validator("archiver", "isolation", "restore", "upstream", mode="before")
    @classmethod
    def _object_or_nothing(cls, value: Any, info: ValidationInfo) -> Any:
        return value if not untrusted(info) or isinstance(value, dict | BaseModel) else None

    @field_validator("rejoin", mode="before")
    @classmethod
    def _rejoin_with_state(cls, value: Any, info: ValidationInfo) -> Any:
        if not untrusted(info) or isinstance(value, BaseModel):
            return value
        return value if isinstance(value, dict) and value.get("state") in ("running", "done", "failed") else None

    @field_validator("in_recovery", "postgres_version", "connections", "config_errors", "replicas", "restart_count",
                     "fenced_since", "streaming", "isolation", "restore", mode="wrap")  # fmt: skip
    @classmethod
    def _unread(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        """Fields the operator does not use: a malformed one reads as absent instead of refusing the report."""
        try:
            return handler(value)
        except ValidationError:
            if untrusted(info):
                return 0 if info.field_name == "restart_count" else None
            raise

    @classmethod
    def read(cls, body: object) -> InstanceStatus | None:
        """The report in a ``GET /status`` body from the network, or None when it is not one (a wrong answer is no
        answer)."""
        if not isinstance(body, dict) or body.get("role") not in ("primary", "replica"):
            return None
        if not isinstance(body.get("name"), str) or not body["name"]:
            return None
        try:
            return cls.model_validate(body, context=UNTRUSTED)
        except ValidationError:
            return None
