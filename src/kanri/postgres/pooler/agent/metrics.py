"""PgBouncer's ``SHOW POOLS``, ``SHOW STATS``, ``SHOW LISTS`` and ``SHOW CONFIG`` as Prometheus samples, read at
each scrape.

The agent logs in to PgBouncer's admin console (database ``pgbouncer``) on 127.0.0.1 as the lookup role, which
``stats_users`` names, with the password from the pod's auth file and TLS verified against the cluster's CA (the
pooler's certificate carries 127.0.0.1). The console speaks the simple query protocol only (psycopg's
``ClientCursor``). A failed read answers ``kanri_pgbouncer_up 0`` and no other sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kanri.contract.pooler import POOLER_ROLE

__all__ = ["Console", "PoolerCollector", "console_reader", "console_session", "password_from_auth_file", "samples"]

Row = Mapping[str, Any]


class Console(NamedTuple):
    """What one scrape read from the admin console: a list of rows per ``SHOW`` command."""

    pools: Sequence[Row]
    stats: Sequence[Row]
    lists: Sequence[Row] = ()
    config: Sequence[Row] = ()


POOL_GAUGES = {
    "cl_active": ("clients_active", "Client connections linked to a server connection or idle"),
    "cl_waiting": ("clients_waiting", "Client connections waiting for a server connection"),
    "sv_active": ("servers_active", "Server connections linked to a client"),
    "sv_idle": ("servers_idle", "Server connections idle and ready for a client"),
    "sv_used": ("servers_used", "Server connections idle longer than server_check_delay"),
    "sv_login": ("servers_login", "Server connections logging in"),
}
STATS_COUNTERS = {
    "total_xact_count": ("transactions", "SQL transactions pooled", 1.0),
    "total_query_count": ("queries", "SQL queries pooled", 1.0),
    "total_wait_time": ("client_wait_seconds", "Time clients spent waiting for a server connection", 1e-6),
    "total_received": ("received_bytes", "Bytes received from clients", 1.0),
    "total_sent": ("sent_bytes", "Bytes sent to clients", 1.0),
}
CLIENTS = ("kanri_pgbouncer_client_connections", "Client connections PgBouncer holds (SHOW LISTS used_clients)")
MAX_CLIENTS = ("kanri_pgbouncer_max_client_connections", "The max_client_conn setting PgBouncer runs with")


def password_from_auth_file(path: Path, user: str = POOLER_ROLE) -> str | None:
    """The password of ``user`` in a PgBouncer auth file (``"user" "password"`` lines, ``""`` escaping ``"``)."""
    for line in path.read_text().splitlines():
        parts, current, quoted, i = [], "", False, 0
        while i < len(line):
            char = line[i]
            if char == '"' and quoted and line[i + 1 : i + 2] == '"':
                current, i = current + '"', i + 2
                continue
            if char == '"':
                quoted = not quoted
                if not quoted:
                    parts.append(current)
                    current = ""
            elif quoted:
                current += char
            i += 1
        if len(parts) >= 2 and parts[0] == user:
            return parts[1]
    return None


def _setting(rows: Iterable[Row], key_column: str, key: str, value_column: str) -> float | None:
    """The number in ``value_column`` of the row whose ``key_column`` is ``key`` (None when absent)."""
    for row in rows:
        if row.get(key_column) == key and row.get(value_column) is not None:
            return float(row[value_column])
    return None


def samples(pools: Iterable[Row], stats: Iterable[Row], lists: Iterable[Row] = (),
            config: Iterable[Row] = ()) -> list[Metric]:  # fmt: skip
    """The metric families of one scrape (pure): a gauge per pool column, a counter per stats column, and the client
    connections held against ``max_client_conn`` (each only when its row was read)."""
    families: list[Metric] = [GaugeMetricFamily("kanri_pgbouncer_up", "PgBouncer's admin console answered", value=1)]
    gauges = {column: GaugeMetricFamily(f"kanri_pgbouncer_{name}", text, labels=["database", "user"])
              for column, (name, text) in POOL_GAUGES.items()}  # fmt: skip
    wait = GaugeMetricFamily("kanri_pgbouncer_max_wait_seconds", "Longest wait of a client in the pool",
                             labels=["database", "user"])  # fmt: skip
    for row in pools:
        labels = [str(row.get("database")), str(row.get("user"))]
        for column, family in gauges.items():
            family.add_metric(labels, float(row.get(column) or 0))
        wait.add_metric(labels, float(row.get("maxwait") or 0) + float(row.get("maxwait_us") or 0) / 1e6)
    counters = {column: CounterMetricFamily(f"kanri_pgbouncer_{name}", text, labels=["database"])
                for column, (name, text, _) in STATS_COUNTERS.items()}  # fmt: skip
    for row in stats:
        for column, counter in counters.items():
            counter.add_metric([str(row.get("database"))], float(row.get(column) or 0) * STATS_COUNTERS[column][2])
    for (name, text), value in ((CLIENTS, _setting(lists, "list", "used_clients", "items")),
                                (MAX_CLIENTS, _setting(config, "key", "max_client_conn", "value"))):  # fmt: skip
        if value is not None:
            families.append(GaugeMetricFamily(name, text, value=value))
    return [*families, *gauges.values(), wait, *counters.values()]


def console_session(port: int, auth_file: Path, ca_file: Path) -> psycopg.Connection[Any]:
    """A session on the local PgBouncer's admin console as the lookup role (TLS verified against the cluster's CA;
    the console speaks the simple query protocol only: ``ClientCursor``)."""
    password = password_from_auth_file(auth_file)
    return psycopg.connect(host="127.0.0.1", port=port, dbname="pgbouncer", user=POOLER_ROLE, password=password,
                           sslmode="verify-full", sslrootcert=str(ca_file), connect_timeout=3, autocommit=True,
                           cursor_factory=psycopg.ClientCursor)  # fmt: skip


def console_reader(port: int, auth_file: Path, ca_file: Path) -> Callable[[], Console]:
    """Reads the :class:`Console` commands from the local PgBouncer, in one session."""

    def read() -> Console:
        with console_session(port, auth_file, ca_file) as conn:
            found: list[list[Row]] = []
            for command in ("SHOW POOLS", "SHOW STATS", "SHOW LISTS", "SHOW CONFIG"):
                cursor = conn.execute(command)
                names = [c.name for c in cursor.description or []]
                found.append([dict(zip(names, row, strict=True)) for row in cursor.fetchall()])
            return Console(*found)

    return read


class PoolerCollector(Collector):
    """A collector that asks PgBouncer at each scrape."""

    def __init__(self, read: Callable[[], Console]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        try:
            console = self.read()
        except (psycopg.Error, OSError):
            yield GaugeMetricFamily("kanri_pgbouncer_up", "PgBouncer's admin console answered", value=0)
            return
        yield from samples(*console)
