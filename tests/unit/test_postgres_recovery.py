"""bootstrap.recovery on the operator's side: where the source's backups are, the instance.json entry, the
condition."""

from __future__ import annotations

from typing import Any

from kanri.instance.recovery_plan import RecoveryPlan
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.api.v1alpha1.bootstrap import Recovery
from kanri.postgres.backup.archiving import BackupSettings, KeysProblem, Repository, identities_for
from kanri.postgres.recovery.bootstrap import Problem, entry, resolve, same_path, verdict

S3 = {"endpoint": "http://s3:8333", "bucket": "team-backups", "credentialsSecret": {"name": "team-keys"}}
DEFAULT = S3Repository.model_validate({"endpoint": "http://weed:8333", "bucket": "kanri-backups", "path": "dev",
                                       "credentialsSecret": {"name": "platform-keys"}})  # fmt: skip
PLATFORM = BackupSettings(default_repository=DEFAULT, default_namespace="kanri-system")


def recovery(**fields: Any) -> Recovery:
    return Recovery.model_validate({"source": "orders", **fields})


def source(backup: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"version": 16, "storage": {"size": "1Gi"}}
    if backup is not None:
        spec["backup"] = backup
    return {"metadata": {"name": "orders"}, "spec": spec}


def test_a_named_repository_wins_and_its_secret_is_in_the_cluster_namespace() -> None:
    found = resolve(recovery(repository={"s3": S3}), source({}), "shop", PLATFORM)
    assert isinstance(found, Repository)
    assert (found.destination, found.secret_namespace, found.default) == ("s3://team-backups", "shop", False)


def test_the_source_clusters_own_repository_or_its_default_is_used() -> None:
    own = resolve(recovery(), source({"repository": {"s3": S3}}), "shop", PLATFORM)
    assert isinstance(own, Repository)
    assert own.destination == "s3://team-backups"
    default = resolve(recovery(), source({"retentionDays": 14}), "shop", PLATFORM)
    assert isinstance(default, Repository)
    assert (default.destination, default.secret_namespace, default.default) == ("s3://kanri-backups/dev/shop",
                                                                                "kanri-system", True)  # fmt: skip


def test_a_deleted_source_is_looked_for_in_the_platform_default() -> None:
    found = resolve(recovery(), None, "shop", PLATFORM)
    assert isinstance(found, Repository)
    assert found.default


def test_a_source_that_is_nowhere_or_has_no_backups_is_a_specific_reason() -> None:
    nowhere = resolve(recovery(), None, "shop", BackupSettings())
    assert isinstance(nowhere, Problem)
    assert nowhere.reason == "SourceNotFound"
    no_backups = resolve(recovery(), source(None), "shop", PLATFORM)
    assert isinstance(no_backups, Problem)
    assert no_backups.reason == "SourceHasNoBackups"
    no_repository = resolve(recovery(), source({"retentionDays": 3}), "shop", BackupSettings())
    assert isinstance(no_repository, Problem)
    assert no_repository.reason == "SourceHasNoRepository"


def test_the_entry_names_the_source_server_and_the_target_and_is_what_the_instance_reads() -> None:
    repository = Repository(DEFAULT, "kanri-system", default=True)
    document = entry(recovery(targetTime="2026-12-01T10:00:00Z", backup="20261201T000000"), repository)
    assert document == {
        "source": {"destination": "s3://kanri-backups/dev", "endpointURL": "http://weed:8333", "serverName": "orders"},
        "backup": "20261201T000000",
        "targetTime": "2026-12-01T10:00:00+00:00",
    }
    plan = RecoveryPlan.model_validate(document)
    assert plan.source.server_name == "orders"
    assert plan.target_time is not None
    assert entry(recovery(targetLSN="0/3000060"), repository)["targetLSN"] == "0/3000060"
    assert entry(recovery(targetImmediate=True), repository)["targetImmediate"] is True


def test_restoring_into_the_very_path_it_archives_to_is_detected() -> None:
    repository = Repository(DEFAULT, "kanri-system", default=True)
    own = {"destination": "s3://kanri-backups/dev", "endpointURL": "http://weed:8333", "serverName": "orders"}
    assert same_path(repository, "orders", own)
    assert not same_path(repository, "orders", {**own, "serverName": "orders-restored"})
    assert not same_path(repository, "orders", None)


def test_the_condition_follows_the_restore() -> None:
    repository = Repository(DEFAULT, "kanri-system", default=True)
    wanted = recovery(targetTime="2026-12-01T10:00:00Z")
    restoring = verdict(wanted, repository, initialised=False, credentials=None)
    assert (restoring.ok, restoring.reason) == (False, "Restoring")
    assert (
        "the latest backup of s3://kanri-backups/dev/orders (default), up to 2026-12-01T10:00:00" in restoring.message
    )
    done = verdict(wanted, repository, initialised=True, credentials=None)
    assert (done.ok, done.reason) == (True, "Restored")
    keys = verdict(wanted, repository, initialised=False,
                   credentials=KeysProblem("CredentialsMissing", "Secret kanri-system/x does not exist"))  # fmt: skip
    assert (keys.ok, keys.reason) == (False, "CredentialsMissing")
    assert keys.message.endswith("Secret kanri-system/x does not exist")
    identity = verdict(wanted, repository, initialised=False,
                       credentials=KeysProblem("TenantIdentityFailing", "IAM CreateUser: AccessDenied"))  # fmt: skip
    assert (identity.ok, identity.reason) == (False, "TenantIdentityFailing")
    missing = verdict(wanted, Problem("SourceNotFound", "nowhere"), initialised=False, credentials=None)
    assert (missing.ok, missing.reason, missing.message) == (False, "SourceNotFound", "nowhere")


def test_a_source_in_another_namespace_cannot_be_reached_through_the_shared_default_repository() -> None:
    # "orders" lives in namespace shop; a user of namespace intruder names it: the default repository's folder of
    # intruder is searched (empty), never shop's
    shop = resolve(recovery(), source({"retentionDays": 14}), "shop", PLATFORM)
    stranger = resolve(recovery(), None, "intruder", PLATFORM)
    assert isinstance(shop, Repository)
    assert isinstance(stranger, Repository)
    assert stranger.destination == "s3://kanri-backups/dev/intruder"
    assert stranger.destination != shop.destination


def test_a_recovery_naming_another_namespaces_folder_of_the_default_repository_is_refused_with_the_reason() -> None:
    isolated = BackupSettings(DEFAULT, "kanri-system", identities=identities_for(DEFAULT, "kanri-system"))
    where = {"endpoint": DEFAULT.endpoint, "bucket": DEFAULT.bucket, "credentialsSecret": {"name": "mine"}}
    named = recovery(repository={"s3": where | {"path": f"{DEFAULT.path}/shop"}})
    refused = resolve(named, None, "intruder", isolated)
    assert isinstance(refused, Problem), refused
    assert refused.reason == "ForeignRepositoryFolder", refused
    assert f"'{DEFAULT.path}/intruder'" in refused.message
    # its own folder is fine
    own = recovery(repository={"s3": where | {"path": f"{DEFAULT.path}/intruder"}})
    assert isinstance(resolve(own, None, "intruder", isolated), Repository)
