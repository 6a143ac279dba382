"""The cluster's credentials: generated once, adopted when they exist, never overwritten, never owned.

Four Secrets per cluster (names in :mod:`kanri.postgres.names`):

| Secret | type | keys | used for |
|---|---|---|---|
| ``<cluster>-superuser`` | basic-auth | username ``postgres``, password | the superuser |
| ``<cluster>-replication`` | basic-auth | username ``streaming_replica``, password | replicas streaming WAL |
| ``<cluster>-app`` | basic-auth | username = ``bootstrap.initdb.owner``, password | the application |
| ``<cluster>-api`` | Opaque | token | the instance managers' HTTP API (bearer token) |

They carry no owner reference, so neither garbage collection nor a ``Retain`` deletion removes them: a cluster
recreated under the same name adopts them and its retained data keeps working with the same passwords. They are
created with POST (never apply), so an existing Secret, including one the cache has not seen yet, is never
overwritten: the API server answers 409 and the existing one is adopted. An adopted Secret is checked every pass
against :mod:`kanri.contract.secrets` (see ``problems.secret_problems``): what is wrong is reported, never repaired.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kanri.contract.roles import REPLICATION_USER, SUPERUSER
from kanri.postgres import names
from kanri.postgres.labels import cluster_labels

__all__ = ["BASIC_AUTH", "REPLICATION_USER", "SUPERUSER", "SecretSpec", "desired_secrets", "secret_value"]

Obj = dict[str, Any]

BASIC_AUTH = "kubernetes.io/basic-auth"


def _password() -> str:
    # 32 random bytes, URL-safe: no quoting trouble in connection strings or .pgpass files.
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class SecretSpec:
    """One credential Secret the cluster needs: its name, type and the fixed (non-secret) part of its data."""

    name: str
    type: str
    username: str | None
    """For basic-auth Secrets; None for the API token."""

    def build(self, cluster: str, namespace: str, generate: Callable[[], str] = _password) -> Obj:
        """A new Secret with a freshly generated password (or token)."""
        data = {"username": self.username, "password": generate()} if self.username else {"token": generate()}
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": self.name, "namespace": namespace, "labels": cluster_labels(cluster)},
            "type": self.type,
            "stringData": data,
        }


def desired_secrets(cluster: str, app_owner: str) -> list[SecretSpec]:
    """Every credential Secret of ``cluster``; ``app_owner`` is ``bootstrap.initdb.owner``."""
    return [
        SecretSpec(names.superuser_secret(cluster), BASIC_AUTH, SUPERUSER),
        SecretSpec(names.replication_secret(cluster), BASIC_AUTH, REPLICATION_USER),
        SecretSpec(names.app_secret(cluster), BASIC_AUTH, app_owner),
        SecretSpec(names.api_secret(cluster), "Opaque", None),
    ]


def secret_value(secret: Obj | None, key: str) -> str | None:
    """The decoded value of ``key`` in a Secret read from the API (``data`` is base64), or None."""
    if secret is None:
        return None
    encoded = (secret.get("data") or {}).get(key)
    if encoded is None:
        return None
    return base64.b64decode(encoded).decode()
