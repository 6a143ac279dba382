"""The objects the operator writes for a Cache: the policy shows in volumes, the password never in plain sight."""

from __future__ import annotations

import json
from typing import Any

from kanri.cache.api import CacheSpec
from kanri.cache.children import READABLE, ROLE, config_map, password_secret, services, statefulset


def spec(**fields: Any) -> CacheSpec:
    return CacheSpec.model_validate(fields)


DURABLE = spec(dataPolicy="Durable", storage={"size": "2Gi"}, resources={"limits": {"memory": "256Mi"}})
REGENERABLE = spec(dataPolicy="Regenerable", replicas=2)


def test_a_durable_cache_claims_a_volume_per_pod_and_keeps_it() -> None:
    body = statefulset("orders", DURABLE)["spec"]
    assert body["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert body["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert "data" not in [v["name"] for v in body["template"]["spec"]["volumes"]]


def test_a_regenerable_cache_runs_on_an_empty_dir() -> None:
    body = statefulset("sessions", REGENERABLE)["spec"]
    assert "volumeClaimTemplates" not in body
    assert {"name": "data", "emptyDir": {}} in body["template"]["spec"]["volumes"]
    assert body["replicas"] == 2


def test_every_pod_runs_a_server_and_a_sentinel_as_non_root() -> None:
    pod = statefulset("orders", DURABLE)["spec"]["template"]["spec"]
    assert [(c["name"], c["args"]) for c in pod["containers"]] == [("valkey", ["server"]), ("sentinel", ["sentinel"])]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["resources"] == {"limits": {"memory": "256Mi"}}
    assert pod["containers"][0]["image"] == "kanri.dev/valkey:9.1"


def test_the_password_is_only_a_mounted_secret() -> None:
    secret = password_secret("orders")
    password = secret["stringData"]["password"]
    assert len(password) >= 32
    assert password not in json.dumps(statefulset("orders", DURABLE))
    assert password not in json.dumps(config_map("orders", DURABLE))
    assert password != password_secret("orders")["stringData"]["password"]


def test_read_write_and_read_only_services_select_the_role_labels() -> None:
    by_name = {s["metadata"]["name"]: s["spec"] for s in services("orders")}
    assert by_name["orders-rw"]["selector"][ROLE] == "primary"
    assert by_name["orders-ro"]["selector"][READABLE] == "true"
    assert by_name["orders-hl"]["clusterIP"] == "None"
    assert by_name["orders-hl"]["publishNotReadyAddresses"] is True
    assert all(s["selector"]["app.kubernetes.io/name"] == "valkey" for s in by_name.values())


def test_the_config_map_carries_the_derived_configuration() -> None:
    data = config_map("orders", DURABLE)["data"]
    assert "appendonly yes" in data["valkey.conf"]
    assert "sentinel monitor orders {primary} 2" in data["sentinel.conf"]
