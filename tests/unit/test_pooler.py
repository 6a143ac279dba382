"""The PostgresPooler's pure parts: pgbouncer.ini, the API's limits, the Deployment's shape, the role's verifier and
the Ready condition (issue 29 item 6). Real PgBouncer before a real cluster: tests/e2e/test_postgres_pooler_e2e.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from kanri.contract.pooler import AUTH_QUERY, POOLER_ROLE, SCRAM_VERIFIER_PATTERN, PoolerRoleRequest
from kanri.contract.roles import reserved_role
from kanri.contract.scram import verifier, verifies
from kanri.postgres.api.v1alpha1.postgres_pooler import (
    OPERATOR_OWNED,
    USER_PARAMETERS,
    PostgresPooler,
    PostgresPoolerSpec,
)
from kanri.postgres.api.v1alpha1.spec import PostgresClusterSpec
from kanri.postgres.pooler import children, config, names, readiness, steps
from kanri.postgres.pooler.agent import metrics as agent_metrics
from kanri.runtime import crd_for


def _settings(ini: str) -> dict[str, str]:
    section = ini.split("[pgbouncer]", 1)[1]
    return dict(line.split(" = ", 1) for line in section.strip().splitlines())


def test_ini_points_every_database_at_the_clusters_service_by_its_certificate_name() -> None:
    ini = config.render(PostgresPoolerSpec(cluster="orders"), "shop")
    assert "* = host=orders-rw.shop.svc port=5432" in ini
    ro = config.render(PostgresPoolerSpec(cluster="orders", type="ro"), "shop")
    assert "* = host=orders-ro.shop.svc port=5432" in ro


def test_ini_has_tls_both_ways_and_auth_through_the_lookup_role() -> None:
    settings = _settings(config.render(PostgresPoolerSpec(cluster="orders"), "shop"))
    assert settings["pool_mode"] == "transaction"
    assert settings["client_tls_sslmode"] == "require"
    assert settings["server_tls_sslmode"] == "verify-full"
    assert settings["server_tls_ca_file"].endswith("/ca.crt")
    assert settings["auth_user"] == POOLER_ROLE
    assert settings["auth_query"] == AUTH_QUERY
    assert settings["auth_type"] == "scram-sha-256"


def test_user_parameters_override_defaults_but_never_owned_settings() -> None:
    spec = PostgresPoolerSpec(cluster="orders", mode="session",
                              parameters={"default_pool_size": "7", "listen_port": "6432"})  # fmt: skip
    settings = _settings(config.render(spec, "shop"))
    assert settings["default_pool_size"] == "7"
    assert settings["listen_port"] == "5432"  # the API refuses it; the renderer drops it anyway
    assert settings["pool_mode"] == "session"
    assert settings["server_login_retry"] == "0.25"  # a default of ours, not PgBouncer's 15 s


def test_the_schema_allows_only_user_parameters_and_names_operator_owned_ones() -> None:
    crd = crd_for(PostgresPooler)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    rule = spec["parameters"]["x-kubernetes-validations"][0]
    assert re.findall(r"'([a-z_]+)'", rule["rule"]) == list(USER_PARAMETERS)
    assert not set(OPERATOR_OWNED) & set(USER_PARAMETERS)
    assert all(name in rule["message"] for name in ("listen_port", "auth_user", "server_tls_sslmode"))
    assert spec["cluster"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    with pytest.raises(ValidationError):
        PostgresPoolerSpec.model_validate({"cluster": "orders", "mode": "statement"})
    with pytest.raises(ValidationError):
        PostgresPoolerSpec.model_validate({"cluster": "orders", "parameters": {"max_client_conn": "1\nx = y"}})


def test_deployment_shape() -> None:
    spec = PostgresPoolerSpec(cluster="orders", instances=3)
    deployment = children.deployment("orders-pool", "shop", spec, "abc123")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"] == {names.CONFIG_HASH: "abc123"}
    assert deployment["spec"]["selector"]["matchLabels"] == names.LABELS.selector("orders-pool")
    assert template["metadata"]["labels"]["app.kubernetes.io/name"] == "pgbouncer"  # never PostgreSQL's Services
    pod = template["spec"]
    assert {c["topologyKey"] for c in pod["topologySpreadConstraints"]} == {
        "topology.kubernetes.io/zone", "kubernetes.io/hostname"}  # fmt: skip
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["image"] == children.IMAGE
    assert container["args"] == ["/etc/pgbouncer/config/pgbouncer.ini"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {v["name"] for v in pod["volumes"]} == {"config", "auth", "tls"}
    # the password is in a mounted file, never in the pod's arguments or environment: the environment has only
    # where the agent follows the primary (the Service PgBouncer uses, the database the lookup role is made in)
    assert container["env"] == [{"name": "KANRI_POOLER_PRIMARY_CHECK",
                                 "value": "host=orders-rw.shop.svc port=5432 dbname=app"}]  # fmt: skip
    reads = PostgresPoolerSpec.model_validate({"cluster": "orders", "type": "ro"})
    assert "env" not in children.deployment("orders-pool", "shop", reads, "h")["spec"]["template"]["spec"][
        "containers"][0], "an ro pooler has no primary to follow"  # fmt: skip
    shop = children.deployment("orders-pool", "shop", spec, "h", database="shop")["spec"]["template"]["spec"]
    assert shop["containers"][0]["env"][0]["value"].endswith("dbname=shop")
    assert container["resources"] == {"requests": children.DEFAULT_REQUESTS}  # never BestEffort
    sized = PostgresPoolerSpec.model_validate({"cluster": "orders", "resources": {"limits": {"memory": "128Mi"}}})
    resources = children.deployment("orders-pool", "shop", sized, "h")["spec"]["template"]["spec"]["containers"][0]
    assert resources["resources"] == {"requests": {"cpu": "50m"}, "limits": {"memory": "128Mi"}}


def test_config_hash_changes_with_any_file() -> None:
    base = {"pgbouncer.ini": b"a", "tls.crt": b"b", "userlist.txt": b"c"}
    assert config.config_hash(base) == config.config_hash(dict(reversed(base.items())))
    assert config.config_hash(base) != config.config_hash(base | {"tls.crt": b"renewed"})


def test_verifier_is_postgresqls_scram_format_and_matches_a_hand_derivation() -> None:
    salt = b"0123456789abcdef"
    made = verifier("pencil", salt=salt, iterations=4096)
    assert re.fullmatch(SCRAM_VERIFIER_PATTERN, made)
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096)
    stored = hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    assert made.split("$")[2].split(":")[0] == base64.b64encode(stored).decode()
    assert verifier("pencil") != verifier("pencil")  # a fresh salt each time
    assert verifies(made, "pencil")
    assert verifies(verifier("pencil"), "pencil")
    assert not verifies(made, "pencil2")
    assert not verifies("md5abc", "pencil")
    assert not verifies(None, "pencil")
    assert not verifies("SCRAM-SHA-256$4096:not base64!$x:y", "pencil")
    assert PoolerRoleRequest(verifier=made, databases=["app"]).as_json() == {"verifier": made, "databases": ["app"]}
    with pytest.raises(ValidationError):
        PoolerRoleRequest(verifier="plaintext", databases=["app"])


def test_auth_file_quotes_the_role_and_password() -> None:
    assert config.auth_file('a"b') == f'"{POOLER_ROLE}" "a""b"\n'


def _seen(**changes: object) -> readiness.Observed:
    values: dict[str, object] = {"cluster": "orders", "cluster_exists": True, "cluster_ready": True,
                                 "ca_available": True, "auth_confirmed": True, "wanted": 2, "ready": 2}  # fmt: skip
    return readiness.Observed(**(values | changes))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, "Ready"),
        ({"cluster_exists": False, "ca_available": False, "auth_confirmed": False}, "ClusterNotFound"),
        ({"ca_available": False, "auth_confirmed": False}, "WaitingForCA"),
        ({"auth_confirmed": False, "cluster_ready": False}, "ClusterNotReady"),
        ({"auth_confirmed": False}, "AuthNotConfigured"),
        ({"wanted": 0, "ready": 0}, "Stopped"),
        ({"ready": 1}, "InstancesNotReady"),
        ({"cluster_ready": False}, "ClusterNotReady"),
    ],
)
def test_ready_names_the_first_closed_gate(changes: dict[str, object], reason: str) -> None:
    verdict = readiness.decide(_seen(**changes))
    assert verdict.reason == reason
    assert verdict.ready is (reason == "Ready")


def test_metrics_from_show_pools_and_show_stats() -> None:
    pools = [{"database": "app", "user": "app", "cl_active": 24, "cl_waiting": 3, "sv_active": 4, "sv_idle": 0,
              "sv_used": 0, "sv_login": 1, "maxwait": 1, "maxwait_us": 500000}]  # fmt: skip
    stats = [{"database": "app", "total_xact_count": 100, "total_query_count": 120, "total_wait_time": 2_000_000,
              "total_received": 10, "total_sent": 20}]  # fmt: skip
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in agent_metrics.samples(pools, stats)
             for s in f.samples}  # fmt: skip
    app = (("database", "app"), ("user", "app"))
    assert found[("kanri_pgbouncer_up", ())] == 1
    assert found[("kanri_pgbouncer_clients_active", app)] == 24
    assert found[("kanri_pgbouncer_clients_waiting", app)] == 3
    assert found[("kanri_pgbouncer_servers_active", app)] == 4
    assert found[("kanri_pgbouncer_max_wait_seconds", app)] == 1.5
    assert found[("kanri_pgbouncer_transactions_total", (("database", "app"),))] == 100
    assert found[("kanri_pgbouncer_client_wait_seconds_total", (("database", "app"),))] == 2.0
    assert "kanri_pgbouncer_client_connections" not in {name for name, _ in found}, "not read: not exported"


def test_client_connections_and_their_limit_from_show_lists_and_show_config() -> None:
    lists = [{"list": "free_clients", "items": 73}, {"list": "used_clients", "items": 27}]
    config = [{"key": "max_client_conn", "value": "1000", "default": "100", "changeable": "yes"},
              {"key": "default_pool_size", "value": "20", "default": "20", "changeable": "yes"}]  # fmt: skip
    families = agent_metrics.samples([], [], lists, config)
    found = {s.name: s.value for f in families for s in f.samples if not s.labels}
    assert found == {"kanri_pgbouncer_up": 1, "kanri_pgbouncer_client_connections": 27,
                     "kanri_pgbouncer_max_client_connections": 1000}  # fmt: skip


def test_a_console_that_does_not_answer_is_up_0_and_nothing_else() -> None:
    def fail() -> agent_metrics.Console:
        raise OSError("connection refused")

    families = list(agent_metrics.PoolerCollector(fail).collect())
    assert [(f.name, [s.value for s in f.samples]) for f in families] == [("kanri_pgbouncer_up", [0])]


def test_the_agent_reads_the_lookup_roles_password_from_the_auth_file(tmp_path: Path) -> None:
    auth = tmp_path / "userlist.txt"
    auth.write_text(config.auth_file('se"cret') + '"other" "x"\n')
    assert agent_metrics.password_from_auth_file(auth) == 'se"cret'
    assert agent_metrics.password_from_auth_file(auth, "nobody") is None


def test_the_role_is_confirmed_per_auth_secret_version_and_per_cluster() -> None:
    secret = {"metadata": {"uid": "s1", "resourceVersion": "7"}}
    cluster = {"metadata": {"uid": "c1"}}
    assert steps.role_version(secret, cluster) == "s1/7@c1"
    assert steps.role_version({"metadata": {"uid": "s1", "resourceVersion": "8"}}, cluster) != "s1/7@c1"
    assert steps.role_version(secret, {"metadata": {"uid": "c2"}}) != "s1/7@c1"  # the same name made again
    assert steps.role_version(None, cluster) is None


def test_the_example_is_a_valid_pooler() -> None:
    document = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "pooler.yaml").read_text())
    assert document["kind"] == "PostgresPooler"
    spec = PostgresPoolerSpec.model_validate(document["spec"])
    assert set(spec.parameters) <= set(USER_PARAMETERS)


def test_the_lookup_role_is_reserved_for_applications() -> None:
    # an application owner or -app Secret named kanri_pooler would take over the role PgBouncer looks users up with
    assert reserved_role(POOLER_ROLE)
    assert reserved_role("KANRI_POOLER ")
    # the API server's rule (its refusal, against a real one: tests/integration/test_postgrescluster_api.py)
    schema = PostgresClusterSpec.model_json_schema()
    owner = schema["$defs"]["InitDB"]["properties"]["owner"]["x-kubernetes-validations"][0]
    assert f"'{POOLER_ROLE}'" in owner["rule"]
    assert f"{POOLER_ROLE} looks users up for the poolers" in owner["messageExpression"]


def test_a_dead_server_fails_its_connections_within_seconds_and_a_slow_one_never() -> None:
    settings = _settings(config.render(PostgresPoolerSpec(cluster="orders"), "shop"))
    assert settings["tcp_keepalive"] == "1"
    silent = int(settings["tcp_keepidle"]) + int(settings["tcp_keepintvl"]) * int(settings["tcp_keepcnt"])
    assert silent <= 15, "probes unanswered: closed within seconds, not Linux's 2 h 11 min"
    assert 0 < int(settings["tcp_user_timeout"]) <= 15_000, "data unacknowledged: closed within seconds"
    assert settings.get("query_timeout", "0") == "0", "a long query on a healthy primary is never cut"
