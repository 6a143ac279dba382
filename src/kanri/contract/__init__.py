"""What the operator and the instance manager agree on, in one place both import.

The operator's API (CEL rules in the PostgresCluster CRD) refuses what the instance manager would refuse, from the
same lists: :mod:`kanri.contract.parameters` (which ``postgresql.conf`` keys a user may set, and how) and
:mod:`kanri.contract.roles` (role and database names PostgreSQL or the operator reserve). The API server is the
first check; the instance manager checks again (a ConfigMap or Secret can be edited past the API's rules).

The wire types between them are declared here once too: :mod:`kanri.contract.status` (the ``GET /status`` body),
:mod:`kanri.contract.actions` (the actions' requests and answers), both built on :mod:`kanri.contract.wire` (camelCase
JSON, defensive reading of a body from the network); :mod:`kanri.contract.problems` holds the problem reasons and
:mod:`kanri.contract.backup` the repository Secret's file names.

This package imports nothing of kanri: ``kanri.postgres`` and ``kanri.instance`` both depend on it, and the instance
still never imports the operator.
"""
