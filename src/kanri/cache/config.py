"""The Valkey and Sentinel configuration a Cache's policy derives: pure functions of the spec, one line per directive.

The password is never here (these lines go into a ConfigMap): the in-pod agent appends ``requirepass``,
``masterauth`` and ``sentinel auth-pass`` from the mounted Secret when it writes the runtime file.
"""

from __future__ import annotations

from kanri.cache.api import CacheSpec, Durability
from kanri.runtime import parse_quantity

__all__ = ["SENTINEL_PORT", "VALKEY_PORT", "maxmemory_bytes", "quorum", "sentinel_config", "server_config"]

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


def sentinel_config(master: str, spec: CacheSpec, primary_host: str) -> list[str]:
    """sentinel.conf for monitoring ``master`` (the cache's name) whose primary is ``primary_host`` at first;
    Sentinel rewrites its file as it learns, so the agent writes this only when the file does not exist yet."""
    return [
        f"port {SENTINEL_PORT}",
        "protected-mode no",
        f"dir {DATA_DIR}",
        "sentinel resolve-hostnames yes",
        "sentinel announce-hostnames yes",
        f"sentinel monitor {master} {primary_host} {VALKEY_PORT} {quorum(spec.replicas)}",
        f"sentinel down-after-milliseconds {master} {spec.down_after_milliseconds}",
        f"sentinel failover-timeout {master} {max(10_000, spec.down_after_milliseconds * 4)}",
        f"sentinel parallel-syncs {master} 1",
    ]
