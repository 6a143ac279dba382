"""The PostgresPooler operator concern: PgBouncer in front of a PostgresCluster's ``-rw`` or ``-ro`` Service.

Pure parts: :mod:`.config` (pgbouncer.ini and its hash), :mod:`.children`
(the Deployment, Service, ConfigMap and Secrets), :mod:`.readiness` (the Ready condition from what was seen). Thin
steps: :mod:`.steps`; the reconciler and its controller: :mod:`.controller`. docs/pooler.md describes the whole.
"""
