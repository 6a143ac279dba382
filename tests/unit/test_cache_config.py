"""The Cache kind's model and the configuration its policy derives (pure: spec -> valkey.conf / sentinel.conf)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kanri.cache.api import Cache, CacheSpec
from kanri.cache.config import maxmemory_bytes, quorum, sentinel_config, server_config
from kanri.runtime import crd_for


def spec(**fields: Any) -> CacheSpec:
    return CacheSpec.model_validate(fields)


def directives(lines: list[str]) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in lines)


def test_data_policy_is_required_and_has_no_default() -> None:
    with pytest.raises(ValidationError, match="dataPolicy"):
        CacheSpec.model_validate({"replicas": 3})
    schema = crd_for(Cache)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "dataPolicy" in schema["required"]
    assert "default" not in schema["properties"]["dataPolicy"]


def test_regenerable_keeps_nothing_on_disk_and_evicts() -> None:
    conf = directives(server_config(spec(dataPolicy="Regenerable")))
    assert conf["appendonly"] == "no"
    assert conf["save"] == '""'
    assert conf["maxmemory-policy"] == "allkeys-lru"
    assert "min-replicas-to-write" not in conf


def test_regenerable_eviction_is_the_users_choice() -> None:
    conf = directives(server_config(spec(dataPolicy="Regenerable", eviction="allkeys-lfu")))
    assert conf["maxmemory-policy"] == "allkeys-lfu"


def test_durable_writes_an_fsynced_append_only_file_and_needs_a_replica() -> None:
    conf = directives(server_config(spec(dataPolicy="Durable", storage={"size": "1Gi"})))
    assert conf["appendonly"] == "yes"
    assert conf["appendfsync"] == "everysec"
    assert conf["min-replicas-to-write"] == "1"
    assert conf["min-replicas-max-lag"] == "10"
    assert conf["maxmemory-policy"] == "noeviction"


def test_durable_always_fsync_and_replica_lag_are_carried_over() -> None:
    durable = spec(dataPolicy="Durable", storage={"size": "1Gi"},
                   durability={"appendfsync": "always", "maxReplicaLagSeconds": 3})  # fmt: skip
    conf = directives(server_config(durable))
    assert (conf["appendfsync"], conf["min-replicas-max-lag"]) == ("always", "3")


def test_replicas_never_serve_data_of_unknown_age() -> None:
    conf = directives(server_config(spec(dataPolicy="Regenerable")))
    assert conf["replica-serve-stale-data"] == "no"
    assert conf["replica-read-only"] == "yes"


def test_no_password_in_the_derived_configuration() -> None:
    lines = server_config(spec(dataPolicy="Durable", storage={"size": "1Gi"})) + sentinel_config(
        "orders", spec(dataPolicy="Regenerable")
    )
    assert not [line for line in lines if "pass" in line or "auth" in line]


def test_maxmemory_is_three_quarters_of_the_memory_limit() -> None:
    limited = spec(dataPolicy="Regenerable", resources={"limits": {"memory": "1Gi"}})
    assert maxmemory_bytes(limited) == 805306368
    assert directives(server_config(limited))["maxmemory"] == "805306368"
    assert maxmemory_bytes(spec(dataPolicy="Regenerable")) is None
    assert "maxmemory" not in directives(server_config(spec(dataPolicy="Regenerable")))


@pytest.mark.parametrize(("replicas", "expected"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_quorum_is_a_majority_of_the_sentinels(replicas: int, expected: int) -> None:
    assert quorum(replicas) == expected


def test_sentinel_monitors_the_cache_with_its_quorum_and_down_after() -> None:
    lines = sentinel_config("orders", spec(dataPolicy="Regenerable", replicas=5, downAfterMilliseconds=1000))
    assert "sentinel monitor orders {primary} 3" in lines
    assert "sentinel down-after-milliseconds orders 1000" in lines
    assert "sentinel failover-timeout orders 3000" in lines  # a split election is tried again after 6 s, not 20


def test_failover_timeout_grows_with_down_after() -> None:
    lines = sentinel_config("orders", spec(dataPolicy="Regenerable", replicas=3, downAfterMilliseconds=5000))
    assert "sentinel failover-timeout orders 15000" in lines
