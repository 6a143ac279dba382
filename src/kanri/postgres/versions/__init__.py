"""Serving the PostgreSQL API's versions from the operator: the conversion webhook in every replica, the
two-version CRDs it converts, and the storage migration (docs/runtime-versions.md, docs/postgrescluster.md)."""

from kanri.postgres.versions.serving import (
    WEBHOOK_SERVICE_ENV,
    VersionServing,
    serve_versions,
    versioned_crds,
    webhook_from_environment,
)
from kanri.postgres.versions.storage import (
    STORAGE_VERSION_ENV,
    STORAGE_VERSIONS,
    StorageVersionRefused,
    check_single_version,
    versions_from_environment,
)

__all__ = [
    "STORAGE_VERSIONS",
    "STORAGE_VERSION_ENV",
    "WEBHOOK_SERVICE_ENV",
    "StorageVersionRefused",
    "VersionServing",
    "check_single_version",
    "serve_versions",
    "versioned_crds",
    "versions_from_environment",
    "webhook_from_environment",
]
