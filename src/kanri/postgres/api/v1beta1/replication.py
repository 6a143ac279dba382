"""v1beta1's replication and failover settings: amounts of WAL are quantities (``16Mi``), not raw byte counts."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from kanri.postgres.api import v1alpha1
from kanri.postgres.api.v1alpha1 import DEFAULT_MAX_DATA_LOSS_BYTES, FailoverPolicy
from kanri.postgres.api.v1alpha1._base import ApiModel
from kanri.postgres.api.v1alpha1.replication import DEFAULT_MAX_READ_LAG_BYTES, DataDurability, ReplicationMode
from kanri.runtime import Quantity, cel, parse_quantity

__all__ = ["DEFAULT_MAX_DATA_LOSS", "MAX_BYTES", "Failover", "Replication", "byte_count", "byte_quantity"]

MAX_BYTES = 2**63 - 1
"""The largest byte count v1alpha1's integer (int64 on the wire) holds: every v1beta1 value must convert to it."""

_BINARY_SUFFIXES = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))


def byte_count(quantity: str | int) -> int:
    """The whole number of bytes ``quantity`` names (``"16Mi"`` -> 16777216); ValueError for a fraction, a
    negative value or more than an int64 holds."""
    value = parse_quantity(quantity)
    if value != value.to_integral_value() or not 0 <= value <= MAX_BYTES:
        raise ValueError(f"{quantity!r} is not a whole number of bytes from 0 to {MAX_BYTES}")
    return int(value)


def byte_quantity(count: int) -> str:
    """The canonical quantity of ``count`` bytes: the largest binary suffix that divides it (16777216 -> ``16Mi``,
    1000 -> ``1000``), so a byte count read back from v1alpha1 comes out the way people write it."""
    for suffix, shift in _BINARY_SUFFIXES:
        if count and count % (1 << shift) == 0:
            return f"{count >> shift}{suffix}"
    return str(count)


def _whole_bytes(value: str) -> str:
    byte_count(value)
    return value


ByteQuantity = Annotated[
    Quantity,
    AfterValidator(_whole_bytes),
    cel(
        # Not a quantity at all: the schema's pattern says so, once. isInteger: fits an int64 (v1alpha1's type).
        "!isQuantity(string(self)) || "
        "(quantity(string(self)).isInteger() && quantity(string(self)).compareTo(quantity('0')) >= 0)",
        "must be a whole number of bytes, 0 or more, such as 16Mi or 1Gi",
    ),
]
"""An amount of WAL or data: a quantity of whole bytes that v1alpha1's byte counts can hold."""


_ALPHA = v1alpha1.Replication.model_fields
_MODE = str(_ALPHA["mode"].description).replace("maxDataLossBytes", "maxDataLoss")


class Replication(ApiModel, validations=v1alpha1.Replication.__kanri_validations__):
    """How replicas follow the primary (streaming replication)."""

    # mode, syncStandbys and dataDurability are v1alpha1's fields, declared with its types, defaults and descriptions.
    mode: Annotated[ReplicationMode, Field(description=_MODE)] = "Async"
    sync_standbys: Annotated[
        Annotated[int, Field(ge=1, le=8)] | None, Field(description=_ALPHA["sync_standbys"].description)
    ] = None
    data_durability: Annotated[DataDurability | None, Field(description=_ALPHA["data_durability"].description)] = None

    max_read_lag: ByteQuantity | None = None
    """How far behind the primary a replica may have replayed, as an amount of WAL such as 16Mi (v1alpha1:
    maxReadLagBytes, a byte count), and still serve reads. Default 16Mi (one WAL segment). A replica further behind,
    or one the primary no longer lists as streaming (its lag is then unknown), leaves the -ro and -r Services until
    it has caught up; the Degraded condition says which (reason ReadsWithheld). Unset: the default."""

    @property
    def durability(self) -> DataDurability:
        """dataDurability, or its default (required)."""
        return self.data_durability or "required"

    @property
    def read_lag_bound(self) -> int:
        """maxReadLag in bytes, or its default."""
        return DEFAULT_MAX_READ_LAG_BYTES if self.max_read_lag is None else byte_count(self.max_read_lag)


DEFAULT_MAX_DATA_LOSS = byte_quantity(DEFAULT_MAX_DATA_LOSS_BYTES)
"""``16Mi``: one WAL segment, the same default as v1alpha1's maxDataLossBytes."""


class Failover(ApiModel):
    """What the operator does when the primary fails: fence it, then promote the replica that received the most WAL.

    The old primary is always fenced (no longer routed to, and stopped if reachable) before a replica is promoted,
    so two primaries never accept writes at the same time. The failover is recorded in status.lastFailover,
    including how many bytes of WAL may have been lost. Defaults: policy Automatic, maxDataLoss 16Mi,
    delaySeconds 0. Every field can be changed at any time and applies to the next failover."""

    policy: FailoverPolicy = "Automatic"
    """Automatic (default): the operator promotes a replica by itself, within the maxDataLoss guard.

    Manual: the operator fences the failed primary, reports the best candidate and waits for a human's approval
    (a condition and an Event say so) before promoting."""

    max_data_loss: ByteQuantity = DEFAULT_MAX_DATA_LOSS
    """The RPO guard, an amount of WAL as a quantity such as 16Mi or 1Gi (v1alpha1: maxDataLossBytes, a byte
    count). Default 16Mi (one WAL segment). If the best replica may lack more WAL than this compared with the failed
    primary (or mode Sync has no synchronous standby to promote), an automatic failover stops before promoting and
    waits for approval. 0 allows only failovers that cannot lose data."""

    delay_seconds: Annotated[int, Field(ge=0, le=3600)] = 0
    """How long the primary must stay failed before the failover starts, to ride out short blips. Default 0
    (start as soon as the primary is declared failed); at most 3600."""
