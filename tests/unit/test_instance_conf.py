"""The instance manager's pure parts: settings from the environment, the config file, rendered files, slot names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kanri.instance.conf import (
    quote,
    render_hba,
    render_passfile,
    render_postgresql_conf,
    slot_name,
    split_parameters,
    synchronous_standby_names,
    write_if_changed,
)
from kanri.instance.config import ClusterConfig, Credentials, Settings, SettingsError
from kanri.instance.credentials import check_credentials, check_token
from kanri.instance.postgres_process import remove_stale_pidfile
from kanri.instance.slots import desired_slots

ENV = {"KANRI_CLUSTER": "orders", "POD_NAME": "orders-2"}
REPLICATION = Credentials("streaming_replica", "s3cr:et\\pw")


def conf_lines(text: str) -> dict[str, str]:
    pairs = (line.split(" = ", 1) for line in text.splitlines() if " = " in line and not line.startswith("#"))
    return dict(pairs)


def test_settings_defaults_follow_the_pod_contract() -> None:
    settings = Settings.from_env(ENV)
    assert settings.pgdata == Path("/var/lib/postgresql/data/pgdata")
    assert settings.bootstrap == "primary"
    assert settings.primary_host == "orders-rw"
    assert (settings.pg_port, settings.http_port) == (5432, 8008)
    assert (settings.pg_listen, settings.http_listen) == ("*", "0.0.0.0")
    assert settings.socket_dir == Path("/var/run/postgresql")
    assert settings.passfile == Path("/var/run/postgresql/kanri.pgpass")


def test_one_listen_address_overrides_both_servers() -> None:
    settings = Settings.from_env({**ENV, "KANRI_LISTEN_ADDRESS": "127.0.0.5"})
    assert (settings.pg_listen, settings.http_listen) == ("127.0.0.5", "127.0.0.5")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"POD_NAME": "orders-1"}, "KANRI_CLUSTER"),
        ({**ENV, "KANRI_BOOTSTRAP": "restore"}, "KANRI_BOOTSTRAP"),
        ({**ENV, "KANRI_PG_PORT": "70000"}, "KANRI_PG_PORT"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_cluster_config_reads_the_operator_json() -> None:
    config = ClusterConfig.parse(b'{"parameters": {"work_mem": "8MB"}, "instances": ["a-1"], "synchronousStandbys": 1}')
    assert config.parameters == {"work_mem": "8MB"}
    assert config.instances == ("a-1",)
    assert config.synchronous_standbys == 1
    assert ClusterConfig.parse(b"") == ClusterConfig()


@pytest.mark.parametrize(("raw", "message"), [(b"{", "not JSON"), (b'{"synchronousStandbys": -1}', "invalid")])
def test_a_bad_cluster_config_is_rejected_with_a_short_reason(raw: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterConfig.parse(raw)


def test_credentials_never_show_the_password(tmp_path: Path) -> None:
    (tmp_path / "username").write_text("app\n")
    (tmp_path / "password").write_text("hunter2\n")
    checked = check_credentials("app", tmp_path)
    assert checked.credentials == Credentials("app", "hunter2")
    assert "hunter2" not in repr(checked)
    assert check_credentials("app", tmp_path / "missing").credentials is None


@pytest.mark.parametrize(
    ("purpose", "files", "key"),
    [
        ("replication", {"username": b"streaming_replica", "password": b"\xff\xfe junk"}, "password"),
        ("app", {"username": b"postgres", "password": b"pw"}, "username"),
        ("app", {"username": b"orders_owner", "password": b""}, "password"),
        ("superuser", {"username": b"postgres"}, "password"),
    ],
)
def test_an_unusable_secret_is_refused_naming_the_key_never_the_value(
    tmp_path: Path, purpose: str, files: dict[str, bytes], key: str
) -> None:
    for name, raw in files.items():
        (tmp_path / name).write_bytes(raw)
    checked = check_credentials(purpose, tmp_path)  # type: ignore[arg-type]
    assert checked.credentials is None
    [problem] = checked.problems
    assert (problem.reason, problem.secret, problem.key) == ("InvalidSecret", purpose, key)
    assert problem.message.startswith(f"{purpose} Secret: {key} ")
    password = files.get("password", b"").decode(errors="ignore")
    assert len(password) < 3 or password not in problem.message


def test_a_missing_superuser_secret_is_a_problem_a_missing_app_secret_is_not(tmp_path: Path) -> None:
    assert check_credentials("superuser", tmp_path / "none").problems
    assert check_credentials("app", tmp_path / "none").problems == ()
    assert check_token(tmp_path / "token")[1][0].key == "token"


def test_operator_managed_keys_win_over_user_parameters() -> None:
    settings = Settings.from_env(ENV)
    config = ClusterConfig(
        parameters={"listen_addresses": "0.0.0.0", "work_mem": "8MB", "bad name": "x", "include_if_exists": "/etc/x"}
    )
    allowed, refused = split_parameters(config)
    assert sorted(refused) == ["bad name", "include_if_exists", "listen_addresses"]
    lines = conf_lines(render_postgresql_conf(settings, config, allowed, replica=False, replication=REPLICATION))
    assert lines["listen_addresses"] == "'*'"
    assert lines["work_mem"] == "'8MB'"
    assert "bad name" not in lines
    assert "include_if_exists" not in lines
    assert lines["wal_log_hints"] == "'on'"
    assert lines["wal_level"] == "'replica'"
    assert "primary_conninfo" not in lines


def test_a_replica_conf_names_its_slot_and_a_passfile_never_the_password() -> None:
    settings = Settings.from_env({**ENV, "KANRI_PRIMARY_HOST": "orders-rw", "KANRI_PRIMARY_PORT": "6432"})
    text = render_postgresql_conf(settings, ClusterConfig(), {}, replica=True, replication=REPLICATION)
    lines = conf_lines(text)
    assert lines["primary_slot_name"] == "'orders_2'"
    conninfo = lines["primary_conninfo"]
    for part in ("host=orders-rw", "port=6432", "user=streaming_replica", "application_name=orders-2",
                 "tcp_user_timeout=5000"):  # fmt: skip
        assert part in conninfo
    assert "passfile=/var/run/postgresql/kanri.pgpass" in conninfo
    assert REPLICATION.password not in text
    # Ignored by a standby; in force from the first commit after a promotion.
    assert "synchronous_standby_names" in lines


def test_a_replica_conf_already_names_the_synchronous_standbys_it_will_wait_for_once_promoted() -> None:
    settings = Settings.from_env({**ENV, "KANRI_PRIMARY_HOST": "orders-rw"})
    config = ClusterConfig(instances=("orders-1", "orders-2", "orders-3"), synchronousStandbys=1)
    text = render_postgresql_conf(settings, config, {}, replica=True, replication=REPLICATION)
    assert conf_lines(text)["synchronous_standby_names"] == '\'ANY 1 ("orders-1", "orders-3")\''


def test_synchronous_standbys_is_a_quorum_over_the_others_capped_at_their_number() -> None:
    config = ClusterConfig(instances=("orders-1", "orders-2", "orders-3"), synchronousStandbys=5)
    assert synchronous_standby_names("orders-1", config) == 'ANY 2 ("orders-2", "orders-3")'
    assert synchronous_standby_names("orders-1", config.model_copy(update={"synchronous_standbys": 0})) == ""


def test_values_are_quoted_for_postgresql_conf() -> None:
    assert quote("it's") == "'it''s'"
    assert quote("a\\b") == "'a\\\\b'"
    assert quote(True) == "'on'"
    assert quote(64) == "'64'"


def test_pg_hba_allows_peer_locally_and_only_scram_over_tcp() -> None:
    hba = render_hba(REPLICATION)
    rules = [line.split() for line in hba.splitlines() if line and not line.startswith("#")]
    assert rules == [
        ["local", "all", "postgres", "peer"],
        ["host", "replication", '"streaming_replica"', "all", "scram-sha-256"],
        ["host", "all", "all", "all", "scram-sha-256"],
    ]


def test_the_passfile_escapes_colons_and_backslashes() -> None:
    assert render_passfile(REPLICATION) == "*:*:*:streaming_replica:s3cr\\:et\\\\pw\n"
    assert render_passfile(None) == ""


def test_slots_are_instance_names_with_underscores_for_every_other_instance() -> None:
    assert slot_name("orders-12") == "orders_12"
    assert desired_slots("orders-1", ("orders-1", "orders-2", "orders-3")) == {"orders_2", "orders_3"}


def test_files_are_written_only_when_their_content_changes(tmp_path: Path) -> None:
    path = tmp_path / "postgresql.conf"
    assert write_if_changed(path, "a = '1'\n") is True
    assert write_if_changed(path, "a = '1'\n") is False
    assert path.stat().st_mode & 0o777 == 0o600
    assert write_if_changed(path, "a = '2'\n") is True


@pytest.mark.parametrize("content", ["999999999\n/data\n", "garbage\n", f"{os.getpid()}\n/data\n"])
def test_a_postmaster_pid_file_naming_no_postgres_process_is_removed(tmp_path: Path, content: str) -> None:
    (tmp_path / "postmaster.pid").write_text(content)
    assert remove_stale_pidfile(tmp_path) is True
    assert not (tmp_path / "postmaster.pid").exists()
    assert remove_stale_pidfile(tmp_path) is False
