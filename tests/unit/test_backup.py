"""Backups, first slice: the repository a cluster archives into, the ContinuousArchiving verdict, and the instance
manager's archive command and configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from kanri.instance.archive import ArchiveTarget, archive_parameters, credentials_env, wal_archive_argv
from kanri.instance.config import ClusterConfig
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.backup.archiving import (
    BackupSettings,
    KeysProblem,
    Repository,
    archive_target,
    decide,
    load_repository,
    resolve,
)
from kanri.postgres.cluster.instances import ArchiverReport, InstanceReport

DEFAULT = S3Repository.model_validate(
    {"endpoint": "http://127.0.0.1:8333", "bucket": "platform", "path": "dev", "credentialsSecret": {"name": "keys"}}
)
SETTINGS = BackupSettings(DEFAULT, "kanri-system")


def spec(backup: dict[str, object] | None) -> PostgresClusterSpec:
    body: dict[str, object] = {"version": 15, "storage": {"size": "1Gi"}}
    if backup is not None:
        body["backup"] = backup
    return PostgresClusterSpec.model_validate(body)


def test_retention_alone_is_accepted_and_uses_the_platform_default() -> None:
    found = resolve(spec({"retentionDays": 14}), "apps", SETTINGS)
    assert found == Repository(DEFAULT, "kanri-system", default=True, tenant="apps")
    assert archive_target(found, "orders") == {
        "destination": "s3://platform/dev/apps",  # the shared default repository: a folder per namespace
        "endpointURL": "http://127.0.0.1:8333",
        "serverName": "orders",
    }


def test_the_clusters_own_repository_wins_and_its_secret_is_in_its_namespace() -> None:
    own = {"s3": {"endpoint": "https://s3.example", "bucket": "mine", "credentialsSecret": {"name": "k"}}}
    found = resolve(spec({"repository": own}), "apps", SETTINGS)
    assert isinstance(found, Repository)
    assert (found.s3.bucket, found.secret_namespace, found.default) == ("mine", "apps", False)
    assert found.describe("orders") == "s3://mine/orders"


def test_no_backup_section_means_no_condition_and_no_target() -> None:
    assert resolve(spec(None), "apps", SETTINGS) is None
    assert decide(None, "orders", None, None) is None
    assert archive_target(None, "orders") is None


def test_no_repository_anywhere_is_a_reason_not_an_error() -> None:
    found = resolve(spec({"retentionDays": 14}), "apps", BackupSettings())
    assert found == "NoRepository"
    verdict = decide(found, "orders", None, None)
    assert verdict is not None
    assert (verdict.ok, verdict.reason) == (False, "NoRepository")
    assert archive_target(found, "orders") is None


def primary(**archiver: object) -> InstanceReport:
    fields: dict[str, object] = {
        "mode": "on",
        "last_archived_wal": None,
        "last_archived_time": None,
        "failed_count": 0,
        "last_failed_wal": None,
        "last_failed_time": None,
    }
    fields.update(archiver)
    return InstanceReport(name="orders-1", role="primary", ready=True, running=True,
                          archiver=ArchiverReport(**fields))  # type: ignore[arg-type]  # fmt: skip


REPO = Repository(DEFAULT, "kanri-system", default=True)
T1, T2 = "2026-12-02T04:00:00+00:00", "2026-12-02T04:01:00+00:00"


@pytest.mark.parametrize(
    ("report", "credentials", "ok", "reason", "wal"),
    [
        (None, None, False, "WaitingForPrimary", None),
        (
            primary(),
            KeysProblem("CredentialsMissing", "Secret kanri-system/keys does not exist"),
            False,
            "CredentialsMissing",
            None,
        ),
        (
            primary(),
            KeysProblem("TenantIdentityFailing", "IAM CreateUser: AccessDenied"),
            False,
            "TenantIdentityFailing",
            None,
        ),
        (primary(mode="off"), None, False, "Starting", None),
        (primary(), None, True, "Archiving", None),
        (primary(last_archived_wal="A", last_archived_time=T1), None, True, "Archiving", "A"),
        (
            primary(
                last_archived_wal="A", last_archived_time=T1, failed_count=3, last_failed_wal="B", last_failed_time=T2
            ),
            None,
            False,
            "ArchiveFailing",
            "A",
        ),
        (
            primary(
                last_archived_wal="B", last_archived_time=T2, failed_count=3, last_failed_wal="B", last_failed_time=T1
            ),
            None,
            True,
            "Archiving",
            "B",
        ),
        (primary(failed_count=1, last_failed_wal="A", last_failed_time=T1), None, False, "ArchiveFailing", None),
    ],
)
def test_the_verdict_follows_the_primarys_archiver(
    report: InstanceReport | None, credentials: KeysProblem | None, ok: bool, reason: str, wal: str | None
) -> None:
    verdict = decide(REPO, "orders", report, credentials)
    assert verdict is not None
    assert (verdict.ok, verdict.reason, verdict.last_wal) == (ok, reason, wal)


def test_the_default_repository_file_is_checked(tmp_path: Path) -> None:
    good = tmp_path / "repo.yaml"
    good.write_text("endpoint: http://weed:8333\nbucket: backups\ncredentialsSecret: {name: keys}\n")
    assert load_repository(good).bucket == "backups"
    bad = tmp_path / "bad.yaml"
    bad.write_text("endpoint: http://weed:8333\nbucket: B\ncredentialsSecret: {name: keys}\n")
    with pytest.raises(ValueError, match="bucket"):
        load_repository(bad)


TARGET = ArchiveTarget.model_validate(
    {"destination": "s3://platform/dev", "endpointURL": "http://127.0.0.1:8333", "serverName": "orders"}
)


def test_the_archive_command_carries_no_secret_and_uses_path_addressing() -> None:
    argv = wal_archive_argv(TARGET, "pg_wal/000000010000000000000003", {"KANRI_BARMAN_BIN": "/opt/barman/bin"})
    assert argv[0] == "/opt/barman/bin/barman-cloud-wal-archive"
    assert argv[argv.index("--addressing-style") + 1] == "path"
    assert argv[-3:] == ["s3://platform/dev", "orders", "pg_wal/000000010000000000000003"]


def test_the_key_pair_goes_to_the_environment_from_the_secret_files(tmp_path: Path) -> None:
    (tmp_path / "ACCESS_KEY_ID").write_text("AKID\n")
    (tmp_path / "ACCESS_SECRET_KEY").write_text("s3cr3t")
    assert credentials_env(tmp_path, "eu-west-1") == {
        "AWS_ACCESS_KEY_ID": "AKID",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }


def test_archiving_is_on_only_with_a_target() -> None:
    assert archive_parameters(None) == {"archive_mode": "off"}
    on = archive_parameters(TARGET, "/usr/bin/python3")
    assert on == {"archive_mode": "on", "archive_command": "/usr/bin/python3 -m kanri.instance archive-wal %p"}
    config = ClusterConfig.parse(b'{"archive": {"destination": "s3://b1/x", "endpointURL": "http://h:1", '
                                 b'"serverName": "orders"}}')  # fmt: skip
    assert config.archive is not None
    assert config.archive.server_name == "orders"
