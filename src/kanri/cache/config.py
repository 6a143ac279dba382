"""The Valkey and Sentinel configuration a Cache's policy derives: pure functions of the spec, one line per directive.

The password is never here (these lines go into a ConfigMap): the in-pod agent appends ``requirepass``, the
replication user's own password (a replica's ``masterauth`` is its agent's, per checked source:
:mod:`kanri.cache.agent.sources`) and ``sentinel auth-pass`` from the mounted Secret when it writes the runtime file.
"""

from __future__ import annotations

from kanri.cache.api import CacheSpec, Durability
from kanri.runtime import parse_quantity

__all__ = [
    "PRIMARY_PLACEHOLDER",
    "SENTINEL_PORT",
    "VALKEY_PORT",
    "failover_timeout",
    "maxmemory_bytes",
    "quorum",
    "sentinel_config",
    "server_config",
]

VALKEY_PORT = 6379
SENTINEL_PORT = 26379
DATA_DIR = "/data"


def maxmemory_bytes(spec: CacheSpec) -> int | None:
    """Three quarters of the memory limit (replication buffers and the fork of a rewrite need the rest); None when
    no limit is set (Valkey's default: no bound)."""
    limits = spec.resources.limits if spec.resources else {}
    if "memory" not in limits:
        return None
    return int(parse_quantity(limits["memory"]) * 3 // 4)


def _eviction(spec: CacheSpec) -> str:
    if spec.data_policy == "Durable":
        return "noeviction"  # evicting a key is losing it; the API refuses any other value
    return spec.eviction or "allkeys-lru"


def _persistence(spec: CacheSpec) -> list[str]:
    if spec.data_policy == "Regenerable":
        # nothing on disk: a restarted pod comes back empty, and the agent never lets it be a source (fencing)
        return ['save ""', "appendonly no"]
    durability = spec.durability or Durability()
    return [
        'save ""',
        "appendonly yes",
        f"appendfsync {durability.appendfsync}",
        "aof-use-rdb-preamble yes",
        # a primary cut off from every replica refuses writes it could not keep through a failover
        "min-replicas-to-write 1",
        f"min-replicas-max-lag {durability.max_replica_lag_seconds}",
    ]


def server_config(spec: CacheSpec) -> list[str]:
    """valkey.conf for every pod of a cache with ``spec`` (the role is not here: the agent decides it at start)."""
    lines = [
        f"port {VALKEY_PORT}",
        "bind * -::*",
        "protected-mode no",  # a password is always required (the agent adds requirepass)
        f"dir {DATA_DIR}",
        *_persistence(spec),
        f"maxmemory-policy {_eviction(spec)}",
        "replica-read-only yes",
        # a replica that lost its primary answers errors instead of data of unknown age
        "replica-serve-stale-data no",
        # the primary pings its replicas every second (default 10): an idle link then never looks silent for longer
        # than a second, so a replica's agent withdraws it from -ro only when its data really is past maxLagSeconds
        "repl-ping-replica-period 1",
        "repl-diskless-sync yes",
        "repl-diskless-sync-delay 0",
        "enable-debug-command no",
    ]
    limit = maxmemory_bytes(spec)
    if limit is not None:
        lines.append(f"maxmemory {limit}")
    return lines


def quorum(replicas: int) -> int:
    """Sentinels that must agree the primary is down: a majority of the cache's pods (one Sentinel per pod)."""
    return replicas // 2 + 1


PRIMARY_PLACEHOLDER = "{primary}"
"""Where the agent puts the primary's ``host port`` when it writes Sentinel's first file."""


def failover_timeout(spec: CacheSpec) -> int:
    """Sentinel's ``failover-timeout`` (ms): 3 times down-after, at least 3 s. It bounds a failed election: with a
    pod gone, two Sentinels remain and both must vote for the same leader; when each votes for itself neither is
    elected, and neither tries again for twice the failover-timeout (20 s at the old 10 s, 6 s now).
    The 29-30 s failovers bench/cache_faults.py measured after half of the freezes and partitions were something
    else: a Sentinel's 30 s TILT after a pause (kanri.cache.agent.node.TILT_PERIOD_MS). Promotion and the replicas'
    reconfiguration take about a second each here (Sentinel reads INFO every second during a failover), well
    inside it."""
    return max(3_000, spec.down_after_milliseconds * 3)


def sentinel_config(master: str, spec: CacheSpec) -> list[str]:
    """sentinel.conf's template for monitoring ``master`` (the cache's name); the agent fills in the primary it finds
    and this Sentinel's own address. Sentinel rewrites its file as it learns, so it is written only once."""
    return [
        "protected-mode no",
        "sentinel resolve-hostnames yes",
        "sentinel announce-hostnames yes",
        f"sentinel monitor {master} {PRIMARY_PLACEHOLDER} {quorum(spec.replicas)}",
        f"sentinel down-after-milliseconds {master} {spec.down_after_milliseconds}",
        f"sentinel failover-timeout {master} {failover_timeout(spec)}",
        f"sentinel parallel-syncs {master} 1",
    ]
