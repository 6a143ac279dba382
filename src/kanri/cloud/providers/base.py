"""What the cloud operator asks of a provider: the ``Provider`` Protocol and the plain data it speaks in.

A provider turns the common fields (``Desired``) into its API's calls and reports what exists (``Observed``). Calls
that change something return an ``Operation`` handle the operator keeps in status, so a restarted operator polls
the same operation instead of repeating the call. Errors say who must act: ``Retryable`` / ``Throttled`` (wait and
try again) or ``UserMustFix`` (nothing changes until the spec or the class does). Each provider declares in
``Capabilities`` which common fields it honours; a set field outside them is reported as Unsupported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from kanri.cloud.api import DatabaseClassSpec
    from kanri.runtime import Client

__all__ = [
    "COMMON_FIELDS",
    "Capabilities",
    "Connection",
    "Desired",
    "Observed",
    "Operation",
    "OperationKind",
    "Provider",
    "ProviderError",
    "ProviderSetup",
    "Retryable",
    "Throttled",
    "UserMustFix",
]

OperationKind = Literal["Create", "Modify", "Delete"]

COMMON_FIELDS: tuple[str, ...] = (
    "engine",
    "version",
    "size",
    "storage",
    "region",
    "network.access",
    "network.allowedCidrs",
    "backupRetentionDays",
    "highAvailability",
    "maintenanceWindow",
    "finalSnapshot",
    "adoptExternalId",
)
"""Every common field of a DatabaseInstance spec a provider may or may not honour, by its wire path under spec."""


@dataclass(frozen=True)
class Desired:
    """The database a DatabaseInstance asks for, resolved against its class (size names, default region)."""

    identifier: str
    """The deterministic provider name of the database (same CR -> same name, so a retried create finds it)."""
    owner_uid: str
    """The DatabaseInstance's uid, tagged on the database: the proof that a database of that name is ours."""
    namespace: str
    name: str
    engine: str
    version: int
    size: str
    """The size class name (small, medium, ...)."""
    storage_gib: int
    region: str
    public: bool = False
    allowed_cidrs: tuple[str, ...] = ()
    backup_retention_days: int = 7
    high_availability: bool = False
    maintenance_window: str | None = None
    extension: Mapping[str, Any] = field(default_factory=dict)
    """The ``spec.providers.<this provider>`` block as the wire dict (camelCase keys), unset keys absent."""
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Observed:
    """A database as the provider reports it, normalised to the common fields (None: not reported)."""

    external_id: str
    state: str
    """The provider's lifecycle state, lower case (creating, backing-up, available, modifying, deleting, ...)."""
    owner_uid: str | None = None
    """The uid tag the operator set at create (None for a database made elsewhere: adopted or foreign)."""
    host: str | None = None
    port: int | None = None
    engine: str | None = None
    engine_version: str | None = None
    size: str | None = None
    """The provider's own size (an RDS DBInstanceClass), compared with ``Provider.size_for(desired)``."""
    storage_gib: int | None = None
    public: bool | None = None
    backup_retention_days: int | None = None
    high_availability: bool | None = None
    maintenance_window: str | None = None
    pending: tuple[str, ...] = ()
    """Changes accepted but not applied yet (RDS PendingModifiedValues), by common field name."""
    extension: Mapping[str, Any] = field(default_factory=dict)
    """Provider-specific fields as reported, keyed like the extension block."""
    username: str | None = None
    dbname: str | None = None

    @property
    def settled(self) -> bool:
        """No change under way: the database is available and nothing is pending."""
        return self.state == "available" and not self.pending


@dataclass(frozen=True)
class Operation:
    """The handle of a change the provider carries out asynchronously."""

    kind: OperationKind
    id: str
    """The provider's request/job ID or the idempotency token the call carried."""
    target_state: str
    """``available`` for Create/Modify, ``deleted`` for Delete (the database then is gone)."""
    started: datetime
    fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class Connection:
    """What an application needs to connect, written to the connection Secret. Never logged."""

    host: str
    port: int
    dbname: str
    username: str
    password: str
    ca_pem: str | None = None

    def __repr__(self) -> str:  # the password must not reach a log line through a repr
        return f"Connection(host={self.host!r}, port={self.port}, dbname={self.dbname!r}, username={self.username!r})"


@dataclass(frozen=True)
class Capabilities:
    """The capability matrix row of one provider (docs/cloud.md renders every provider's)."""

    fields: frozenset[str]
    """Common fields (``COMMON_FIELDS`` paths) the provider honours; any other field that is set is Unsupported."""
    extension_fields: frozenset[str]
    """Keys of ``spec.providers.<name>`` it understands."""
    downtime_fields: frozenset[str] = frozenset()
    """Fields whose change needs a restart/downtime: planned, and applied in the maintenance window when one is set."""
    immutable_fields: frozenset[str] = frozenset()
    """Fields the provider cannot change in place once the database exists (named in status when changed)."""
    sizes: frozenset[str] | None = None
    """Size names it can map (None: whatever the class profile maps)."""


@dataclass(frozen=True)
class ProviderSetup:
    """What a provider is built from: one DatabaseClass. Each provider module exposes
    ``def provider(setup: ProviderSetup) -> Provider`` (kanri.cloud.providers.registry calls it)."""

    class_name: str
    spec: DatabaseClassSpec
    credentials: Mapping[str, str] | None
    """The class's credentials Secret's data, decoded (None: no Secret named). Never logged."""
    client: Client
    """The Kubernetes API (the kanri provider's PostgresClusters live there)."""

    def __repr__(self) -> str:
        return f"ProviderSetup(class_name={self.class_name!r}, provider={self.spec.provider!r})"


class ProviderError(Exception):
    """A provider call failed. ``message`` never holds a credential."""

    def __init__(self, message: str, *, action: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.action = action


class Retryable(ProviderError):
    """A transient failure (5xx, a connection reset, a conflicting state): try again later."""


class Throttled(Retryable):
    """The provider refused the call for its rate: back off and spend less of the request budget."""


class UserMustFix(ProviderError):
    """The provider refused what was asked; nothing changes until the spec or class does. ``field`` names the
    common field (or ``providers.<name>.<key>``) at fault when it is known."""

    def __init__(self, message: str, *, field: str | None = None, reason: str = "InvalidRequest",
                 action: str = "") -> None:  # fmt: skip
        super().__init__(message, action=action)
        self.field = field
        self.reason = reason


class Provider(Protocol):
    """One provider account and region (or cluster), as one class configures it. Every method may raise
    ``Retryable``, ``Throttled`` or ``UserMustFix``; none blocks the event loop."""

    name: str
    """``aws`` or ``kanri``: the key of its extension block and capability row."""

    def capabilities(self) -> Capabilities: ...

    def budget_key(self) -> str:
        """Who shares a request budget: the provider, its account/endpoint and region (``aws:acct@url/eu-west-1``)."""
        ...

    async def find(self, desired: Desired) -> Observed | None:
        """The database ``desired.identifier`` names, whatever its owner tag (the caller checks it)."""
        ...

    async def describe(self, external_id: str) -> Observed | None:
        """The database with this ID, None when it does not exist (deleted, or never was)."""
        ...

    async def create(self, desired: Desired, token: str, password: str) -> Operation:
        """Start creating the database. ``token`` makes a repeated call with the same token the same request where
        the API allows; ``password`` is the master password (providers that make their own ignore it)."""
        ...

    async def modify(self, external_id: str, desired: Desired, fields: tuple[str, ...], *, immediately: bool) \
            -> Operation:  # fmt: skip
        """Change exactly ``fields`` (common field paths) to ``desired``'s values; ``immediately=False`` leaves the
        change to the provider's maintenance window."""
        ...

    async def delete(self, external_id: str, final_snapshot_id: str | None) -> Operation:
        """Start deleting the database, taking the named final snapshot first (None: no snapshot)."""
        ...

    async def release(self, external_id: str) -> None:
        """Let the database go (Retain): it keeps running, nothing of the operator holds or deletes it any more."""
        ...

    async def connection(self, observed: Observed, password: str | None) -> Connection | None:
        """The connection details, None while not known. ``password`` is the one given at create (providers that
        keep their own credentials ignore it)."""
        ...

    def size_for(self, desired: Desired) -> str:
        """The provider's own size for ``desired`` (an RDS DBInstanceClass), compared with ``Observed.size``. Raises
        ``UserMustFix(field="size")`` when the class profile does not map ``desired.size``."""
        ...
