"""The Cache operator (Valkey): caches that say whether their data may be lost, and never lose what they promised
to keep (docs/cache.md).

Concern modules: ``api`` (the kind), ``config`` (policy -> valkey.conf), ``fencing`` (who may be a source),
``children`` (what the operator writes), ``operator`` (the reconciler), ``agent`` (the in-pod entrypoint, which
imports nothing of the operator). This module imports nothing, so the in-pod agent can be imported alone.
"""
