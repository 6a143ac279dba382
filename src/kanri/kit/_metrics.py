"""One metric naming rule for every operator on the kit.

``kanri_<operator>_<subject>_<quantity>[_<unit>][_total]``: the operator (``postgres``), what is measured
(``cluster``, ``instance``, ``topic``), the quantity (``ready_instances``), the base unit when there is one
(``seconds``, ``bytes``, ``ratio``) and ``_total`` for counters only — Prometheus' own conventions, with the operator
in the name so two operators' series never share one. Per-object series are labelled ``namespace`` plus the kind's
own name label (``cluster``), and are removed when the object is gone.
"""

from __future__ import annotations

import re

__all__ = ["UNITS", "metric_name"]

UNITS = ("seconds", "bytes", "ratio", "timestamp_seconds")
"""Base units a name may end in (Prometheus: seconds not milliseconds, bytes not megabytes)."""

_WORD = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
_FORBIDDEN_ENDINGS = ("_total", "_count", "_sum", "_bucket", *(f"_{unit}" for unit in UNITS))


def metric_name(operator: str, subject: str, quantity: str, *, unit: str | None = None, counter: bool = False) -> str:
    """The metric's name by the rule above; ``ValueError`` for a part that breaks it.

    >>> metric_name("postgres", "instance", "replication_lag", unit="bytes")
    'kanri_postgres_instance_replication_lag_bytes'
    >>> metric_name("kafka", "topic", "reconfigurations", counter=True)
    'kanri_kafka_topic_reconfigurations_total'
    """
    for what, part in (("operator", operator), ("subject", subject), ("quantity", quantity)):
        if not _WORD.fullmatch(part):
            raise ValueError(f"metric {what} {part!r} must be lower_snake_case")
    if unit is not None and unit not in UNITS:
        raise ValueError(f"metric unit {unit!r} is not a base unit; use one of {', '.join(UNITS)}")
    if quantity.endswith(_FORBIDDEN_ENDINGS):
        raise ValueError(f"metric quantity {quantity!r} must not end in a unit or suffix; pass unit=/counter=")
    if counter and unit == "timestamp_seconds":
        raise ValueError("a timestamp is a gauge, not a counter")
    name = f"kanri_{operator}_{subject}_{quantity}"
    if unit is not None:
        name += f"_{unit}"
    return name + ("_total" if counter else "")
