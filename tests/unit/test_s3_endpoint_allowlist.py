"""The operator's allow-list of S3 endpoints tenants may name (issue 33: the operator must not send signed requests
to any URL a tenant writes): who matches, and what resolve() / decide() / recovery.resolve() make of a refusal."""

from __future__ import annotations

from typing import Any

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.api.v1alpha1.bootstrap import Recovery
from kanri.postgres.backup.archiving import (
    BackupSettings,
    EndpointNotAllowed,
    Repository,
    decide,
    endpoint_allowed,
    resolve,
)
from kanri.postgres.recovery.bootstrap import Problem
from kanri.postgres.recovery.bootstrap import resolve as resolve_recovery

DEFAULT = S3Repository.model_validate({"endpoint": "http://store.kanri-system.svc:8333", "bucket": "backups",
                                       "credentialsSecret": {"name": "keys"}})  # fmt: skip


def _settings(*allowed: str) -> BackupSettings:
    return BackupSettings(DEFAULT, "kanri-system", allowed_endpoints=allowed)


def _spec(endpoint: str) -> PostgresClusterSpec:
    repository: dict[str, Any] = {"s3": {"endpoint": endpoint, "bucket": "backups", "credentialsSecret": {"name": "k"}}}
    return PostgresClusterSpec.model_validate(
        {"version": 15, "replicas": 1, "storage": {"size": "1Gi"}, "backup": {"repository": repository}}
    )


def test_an_empty_allow_list_allows_any_endpoint_as_before() -> None:
    assert endpoint_allowed("http://169.254.169.254", BackupSettings())
    assert isinstance(resolve(_spec("http://tenant.example:9000"), "a", BackupSettings()), Repository)


def test_a_url_entry_matches_scheme_host_and_port_only() -> None:
    settings = _settings("https://s3.eu.example.com")
    assert endpoint_allowed("https://s3.eu.example.com", settings)
    assert endpoint_allowed("https://S3.EU.example.com:443/", settings)  # default port, case, trailing slash
    assert not endpoint_allowed("http://s3.eu.example.com", settings)  # another scheme
    assert not endpoint_allowed("https://s3.eu.example.com:8443", settings)
    assert not endpoint_allowed("https://s3.eu.example.com.evil.net", settings)  # a look-alike host
    assert not endpoint_allowed("https://s3.eu.example.com@evil.net", settings)  # userinfo: the host is evil.net


def test_a_host_entry_matches_any_port_and_a_host_port_entry_only_that_port() -> None:
    assert endpoint_allowed("http://minio.storage:9000", _settings("minio.storage"))
    assert endpoint_allowed("https://minio.storage", _settings("minio.storage"))
    assert endpoint_allowed("http://minio.storage:9000", _settings("minio.storage:9000"))
    assert not endpoint_allowed("http://minio.storage:9001", _settings("minio.storage:9000"))
    assert not endpoint_allowed("http://127.0.0.1:9000", _settings("minio.storage"))
    assert not endpoint_allowed("not a url", _settings("minio.storage"))


def test_the_default_repositorys_endpoint_is_always_allowed() -> None:
    assert endpoint_allowed("http://store.kanri-system.svc:8333", _settings("minio.storage"))
    assert not endpoint_allowed("http://store.kanri-system.svc:9999", _settings("minio.storage"))


def test_resolve_refuses_a_tenant_endpoint_outside_the_list_and_the_condition_names_it() -> None:
    found = resolve(_spec("http://127.0.0.1:9999"), "a", _settings("minio.storage"))
    assert isinstance(found, EndpointNotAllowed)
    assert found == "EndpointNotAllowed"
    verdict = decide(found, "orders", None, None)
    assert verdict is not None
    assert (verdict.ok, verdict.reason) == (False, "EndpointNotAllowed")
    assert "http://127.0.0.1:9999" in verdict.message
    assert "--allowed-backup-endpoint" in verdict.message
    assert "backup.allowedEndpoints" in verdict.message
    # the platform default needs no entry: a cluster without a repository of its own still archives
    plain = PostgresClusterSpec.model_validate({"version": 15, "replicas": 1, "storage": {"size": "1Gi"}, "backup": {}})
    assert isinstance(resolve(plain, "a", _settings("minio.storage")), Repository)


def test_recovery_refuses_a_named_repository_outside_the_list() -> None:
    recovery = Recovery.model_validate({"source": "payroll", "repository": {"s3": {
        "endpoint": "http://10.0.0.9:8333", "bucket": "backups", "credentialsSecret": {"name": "k"}}}})  # fmt: skip
    found = resolve_recovery(recovery, None, "a", _settings("minio.storage"))
    assert isinstance(found, Problem)
    assert found.reason == "EndpointNotAllowed"
    assert "bootstrap.recovery.repository.s3.endpoint http://10.0.0.9:8333" in found.message
    assert isinstance(resolve_recovery(recovery, None, "a", _settings("10.0.0.9:8333")), Repository)


def test_recovery_from_a_source_cluster_whose_endpoint_is_refused_says_so() -> None:
    recovery = Recovery.model_validate({"source": "payroll"})
    source = {"spec": _spec("http://127.0.0.1:9999").model_dump(by_alias=True, exclude_none=True)}
    found = resolve_recovery(recovery, source, "a", _settings("minio.storage"))
    assert isinstance(found, Problem)
    assert found.reason == "EndpointNotAllowed"
    assert "http://127.0.0.1:9999" in found.message
