"""The agent's own pod label (``-rw`` follows a failover while the operator is down): which role a pod publishes, and
the narrow access the operator gives the agents to do it."""

from __future__ import annotations

from pathlib import Path

import certifi
import pytest

from kanri.cache.agent.fencing import History
from kanri.cache.agent.labels import (
    RETRY_AFTER,
    ApiServer,
    LabelError,
    PodLabel,
    pod_label_from_environment,
    role_label,
    sole_primary,
)
from kanri.cache.agent.node import FENCED_PRIMARY
from kanri.cache.api import CacheSpec
from kanri.cache.children import (
    AGENT_TOKEN_DIR,
    ROLE,
    agent_role,
    agent_role_binding,
    agent_service_account,
    statefulset,
)

REPLID = "a" * 40


def server(role: str, primary_host: str | None = None) -> History:
    return History(host="c-0:6379", role=role, replid=REPLID, offset=10, primary_host=primary_host)  # type: ignore[arg-type]


def test_a_primary_labels_itself_primary_and_a_replica_replica() -> None:
    assert role_label(server("primary")) == "primary"
    assert role_label(server("replica", "c-1:6379")) == "replica"


def test_a_fenced_or_stepping_down_pod_never_labels_itself_primary() -> None:
    assert role_label(server("replica", FENCED_PRIMARY.replace(" ", ":"))) == "replica"
    assert role_label(server("primary"), stepping_down=True) == "replica"


def test_only_the_primary_a_majority_of_sentinels_name_takes_the_label_from_other_pods() -> None:
    assert sole_primary("c-1", [("c-1", 3), ("c-1", 3), ("c-0", 2)], 3)  # the third Sentinel still lags
    assert not sole_primary("c-1", [("c-1", 3)], 3), "only its own Sentinel answers: it may be the one cut off"
    assert not sole_primary("c-0", [("c-0", 2), ("c-0", 2), ("c-1", 3)], 3), "the newest epoch names another pod"
    assert not sole_primary("c-0", [], 3)
    assert sole_primary("c-0", [("c-0", 1), ("c-0", 1)], 3)


def test_a_silent_server_leaves_the_label_as_it_is() -> None:
    assert role_label(None) is None
    assert role_label(None, stepping_down=True) is None


def test_the_agents_may_get_and_patch_exactly_their_caches_pods() -> None:
    role = agent_role("orders", 3)
    assert role["metadata"]["name"] == "orders-agent"
    pods = ["orders-0", "orders-1", "orders-2"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "resourceNames": pods, "verbs": ["get", "patch"]}
    ]
    assert agent_role("orders", 4)["rules"][0]["resourceNames"][-1] == "orders-3"  # a scale-up widens it
    binding = agent_role_binding("orders")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "orders-agent"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "orders-agent"}]
    assert agent_service_account("orders")["automountServiceAccountToken"] is False


def test_only_the_server_container_gets_the_token_and_knows_the_label() -> None:
    pod = statefulset("orders", CacheSpec.model_validate({"dataPolicy": "Regenerable"}))["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "orders-agent"
    assert pod["automountServiceAccountToken"] is False
    mounted = {c["name"]: [m["mountPath"] for m in c["volumeMounts"]] for c in pod["containers"]}
    assert AGENT_TOKEN_DIR in mounted["valkey"]
    assert AGENT_TOKEN_DIR not in mounted["sentinel"]
    token = next(v for v in pod["volumes"] if v["name"] == "api-token")["projected"]
    assert {next(iter(source)) for source in token["sources"]} == {"serviceAccountToken", "configMap", "downwardAPI"}
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["CACHE_ROLE_LABEL"] == ROLE


def test_without_a_token_the_agent_leaves_labelling_to_the_operator(tmp_path: Path) -> None:
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "POD_NAME": "orders-1",
               "POD_NAMESPACE": "shop", "CACHE_ROLE_LABEL": ROLE}  # fmt: skip
    assert pod_label_from_environment(environ, tmp_path) is None
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("c")
    label = pod_label_from_environment(environ, tmp_path)
    assert label is not None
    assert (label.pod, label.namespace, label.key, label.api.host, label.api.port) == ("orders-1", "shop", ROLE,
                                                                                     "10.96.0.1", 443)  # fmt: skip
    assert label.path() == "/api/v1/namespaces/shop/pods/orders-1"
    assert label.others == ()  # no CACHE_REPLICAS: no other pod is known
    cache = pod_label_from_environment(environ | {"CACHE_NAME": "orders", "CACHE_REPLICAS": "3"}, tmp_path)
    assert cache is not None
    assert cache.others == ("orders-0", "orders-2")
    assert pod_label_from_environment(environ | {"CACHE_ROLE_LABEL": ""}, tmp_path) is None


async def test_an_api_server_that_does_not_answer_never_stops_the_agent(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    now = [10.0]
    api = ApiServer("127.0.0.1", 1, Path(certifi.where()), tmp_path / "token", timeout=0.5)
    label = PodLabel(api, "shop", "orders-0", ROLE, clock=lambda: now[0])
    await label.keep("primary")  # refused: logged once, no exception
    assert label.failing
    assert label.written is None
    assert label.retry_at == 10.0 + RETRY_AFTER, "the next try waits; a partitioned pod does not hammer the API"
    with pytest.raises(LabelError, match="FileNotFoundError"):  # a token being rotated: one failed try
        await ApiServer("127.0.0.1", 1, Path(certifi.where()), tmp_path / "gone").request("GET", "/")


async def test_the_role_loop_never_waits_for_the_api_server(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    api = ApiServer("127.0.0.1", 1, Path(certifi.where()), tmp_path / "token", timeout=0.5)
    label = PodLabel(api, "shop", "orders-0", ROLE)
    label.offer("primary")  # returns at once; the write runs in the background
    first = label.in_flight
    label.offer("replica")  # dropped while one is in flight: the next round offers again
    assert label.in_flight is first
    assert first is not None
    await first
    assert label.failing
