"""The pure parts of the tenant boundary in the default repository (kanri.postgres.backup.tenant_identity,
backup.resolve):
names, the policy, which paths are a namespace's own, and the refusal of another namespace's folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.backup.archiving import (
    BackupSettings,
    DefaultRepository,
    ForeignFolder,
    Repository,
    decide,
    foreign_folder,
    identities_for,
    load_repository,
    resolve,
)
from kanri.postgres.backup.tenant_identity import folder, inside, keys_secret_name, policy, user_name

DEFAULT = S3Repository.model_validate(
    {
        "endpoint": "http://kanri-s3.kanri-system.svc:8333",
        "bucket": "kanri-backups",
        "path": "dev",
        "credentialsSecret": {"name": "kanri-s3-keys"},
    }
)
ISOLATED = BackupSettings(DEFAULT, "kanri-system", identities=identities_for(DEFAULT, "kanri-system"))


def spec_with(repository: dict[str, object] | None) -> PostgresClusterSpec:
    backup: dict[str, object] = {"retentionDays": 1}
    if repository is not None:
        backup["repository"] = {"s3": repository | {"credentialsSecret": {"name": "orders-backup-credentials"}}}
    return PostgresClusterSpec.model_validate(
        {"version": 15, "replicas": 1, "storage": {"size": "1Gi"}, "backup": backup}
    )


def test_a_namespace_folder_is_the_repository_path_then_the_namespace() -> None:
    assert folder("dev", "tenant-a") == "dev/tenant-a"
    assert folder("/dev/", "tenant-a") == "dev/tenant-a"
    assert folder(None, "tenant-a") == "tenant-a"


@pytest.mark.parametrize(
    ("path", "ok"),
    [("dev/tenant-a", True), ("dev/tenant-a/", True), ("dev/tenant-a/old", True), ("dev/tenant-ab", False),
     ("dev/tenant-b", False), ("dev", False), ("", False), (None, False), ("dev/tenant-a/../tenant-b", True)],
)  # fmt: skip
def test_only_paths_under_the_own_folder_are_inside(path: str | None, ok: bool) -> None:
    # ("..": S3 keys are not paths: "dev/tenant-a/../tenant-b/x" is a key under dev/tenant-a/, which the policy allows)
    assert inside("dev/tenant-a", path) is ok


def test_user_names_fit_iam_differ_per_folder_and_stay_readable() -> None:
    long = "n" * 63
    assert len(user_name("kanri-backups", "dev", long)) <= 64
    assert user_name("kanri-backups", "dev", "tenant-a").startswith("kanri-tenant-a-")
    assert user_name("kanri-backups", "dev", "tenant-a") != user_name("kanri-backups", "prod", "tenant-a")
    assert user_name("kanri-backups", "dev", "tenant-a") != user_name("other", "dev", "tenant-a")
    assert user_name("kanri-backups", "dev", "a") == user_name("kanri-backups", "dev", "a")  # deterministic
    assert keys_secret_name("tenant-a") == "kanri-backup-tenant-tenant-a"


def test_the_policy_grants_the_own_folder_only() -> None:
    document = json.loads(policy("kanri-backups", "dev", "tenant-a"))
    listing, objects = document["Statement"]
    assert listing["Action"] == ["s3:ListBucket"]
    assert listing["Resource"] == ["arn:aws:s3:::kanri-backups"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["dev/tenant-a/*"]}}
    assert objects["Resource"] == ["arn:aws:s3:::kanri-backups/dev/tenant-a/*"]
    assert set(objects["Action"]) == {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}
    assert all(s["Effect"] == "Allow" for s in document["Statement"])
    assert "iam" not in json.dumps(document).lower().replace("kanri", "")


def test_the_default_repository_isolates_tenants_unless_declared_shared(tmp_path: Path) -> None:
    file = tmp_path / "repo.yaml"
    file.write_text("endpoint: http://weed:8333\nbucket: backups\ncredentialsSecret: {name: keys}\n")
    loaded = load_repository(file)
    assert isinstance(loaded, DefaultRepository)
    assert loaded.tenant_isolation == "IAMUser"
    made = identities_for(loaded, "kanri-system")
    assert made is not None
    assert made.endpoint == "http://weed:8333"
    assert made.operator_namespace == "kanri-system"
    file.write_text(file.read_text() + "iamEndpoint: https://iam.amazonaws.com\n")
    made = identities_for(load_repository(file), "ops")
    assert made is not None
    assert made.endpoint == "https://iam.amazonaws.com"
    file.write_text(file.read_text() + "tenantIsolation: Shared\n")
    assert identities_for(load_repository(file), "ops") is None
    file.write_text(file.read_text().replace("Shared", "Nobody"))
    with pytest.raises(ValueError, match="tenantIsolation"):
        load_repository(file)
    assert identities_for(None, "ops") is None


def test_a_cluster_naming_another_namespaces_folder_of_the_default_repository_is_refused() -> None:
    foreign = resolve(spec_with({"endpoint": "HTTP://kanri-s3.kanri-system.svc:8333/", "bucket": "kanri-backups",
                                 "path": "dev/tenant-b"}), "tenant-a", ISOLATED)  # fmt: skip
    assert isinstance(foreign, ForeignFolder)
    assert foreign == "ForeignRepositoryFolder"
    verdict = decide(foreign, "orders", None, None)
    assert verdict is not None
    assert not verdict.ok
    assert verdict.reason == "ForeignRepositoryFolder"
    assert "'dev/tenant-b'" in verdict.message
    assert "'dev/tenant-a'" in verdict.message
    # the bucket's root (every namespace) is foreign too
    assert isinstance(resolve(spec_with({"endpoint": DEFAULT.endpoint, "bucket": "kanri-backups"}), "tenant-a",
                              ISOLATED), ForeignFolder)  # fmt: skip


def test_the_own_folder_another_bucket_or_store_and_a_shared_default_are_not_refused() -> None:
    own = resolve(spec_with({"endpoint": DEFAULT.endpoint, "bucket": "kanri-backups", "path": "dev/tenant-a/old"}),
                  "tenant-a", ISOLATED)  # fmt: skip
    assert isinstance(own, Repository)
    assert not own.default
    other_bucket = S3Repository.model_validate({"endpoint": DEFAULT.endpoint, "bucket": "tenant-a-own",
                                                "credentialsSecret": {"name": "k"}})  # fmt: skip
    assert foreign_folder(other_bucket, "tenant-a", ISOLATED) is None
    other_store = other_bucket.model_copy(update={"endpoint": "https://s3.example.com", "bucket": "kanri-backups"})
    assert foreign_folder(other_store, "tenant-a", ISOLATED) is None
    shared = BackupSettings(DEFAULT, "kanri-system", identities=None)
    root = S3Repository.model_validate({"endpoint": DEFAULT.endpoint, "bucket": "kanri-backups",
                                        "credentialsSecret": {"name": "k"}})  # fmt: skip
    assert foreign_folder(root, "tenant-a", shared) is None
