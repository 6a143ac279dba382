"""kanri.postgres: the PostgreSQL operator built on kanri.runtime.

The API users write (``PostgresCluster``) lives in :mod:`kanri.postgres.api.v1alpha1`; see docs/postgrescluster.md.
"""
