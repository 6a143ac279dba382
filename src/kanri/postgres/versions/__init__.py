"""Serving the PostgreSQL API's versions from the operator: the conversion webhook in every replica, the
two-version CRDs it converts, and the storage migration (docs/runtime-versions.md, docs/postgrescluster.md)."""

from kanri.postgres.versions.serving import (
    WEBHOOK_SERVICE_ENV,
    VersionServing,
    serve_versions,
    versioned_crds,
    webhook_from_environment,
)

__all__ = ["WEBHOOK_SERVICE_ENV", "VersionServing", "serve_versions", "versioned_crds", "webhook_from_environment"]
