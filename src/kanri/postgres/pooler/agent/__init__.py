"""The PgBouncer pods' entrypoint (``python -m kanri.postgres.pooler.agent <pgbouncer.ini>``): it runs PgBouncer as
its child and serves PgBouncer's pools and stats for Prometheus.

It imports nothing of the operator (the rest of :mod:`kanri.postgres`, the kit, the runtime; an import contract in
pyproject.toml says so): only the standard library, psycopg, prometheus_client and :mod:`kanri.contract`.
"""
