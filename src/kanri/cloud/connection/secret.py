"""The connection Secret ``<name>-connection``: host, port, dbname, username, password (and ca.crt with TLS).

The password is generated and written *before* the database is created (so a restart never makes a second one
that nobody knows). The Secret has no owner reference: deletionPolicy decides whether it goes with the instance."""

from __future__ import annotations

import base64
import secrets

from kanri.cloud import naming
from kanri.cloud.context import CloudContext
from kanri.cloud.names import LABELS
from kanri.cloud.providers.base import Connection, Observed
from kanri.runtime import ApiError
from kanri.runtime.kinds import SECRET

__all__ = ["ensure_password", "write"]


def _decoded(secret: dict[str, object], key: str) -> str | None:
    data = secret.get("data") or {}
    assert isinstance(data, dict)
    value = data.get(key)
    return base64.b64decode(value).decode() if isinstance(value, str) else None


async def ensure_password(c: CloudContext) -> str:
    """The master password: the Secret's, or a new one written first (create-once; a racing pass reads it back)."""
    name = naming.connection_secret(c.ctx.name)
    try:
        current = await c.ctx.client.get(SECRET, name, c.ctx.namespace)
    except ApiError as error:
        if not error.not_found:
            raise
        current = None
    password = _decoded(current, "password") if current else None
    if password:
        return password
    password = secrets.token_urlsafe(24)
    labels = LABELS.labels(c.ctx.name)
    if current is not None:  # a Secret of that name without a password (made by hand): add ours
        meta = {"labels": labels, "resourceVersion": current["metadata"]["resourceVersion"]}
        await c.ctx.client.patch(SECRET, name, {"metadata": meta, "stringData": {"password": password}},
                                 c.ctx.namespace)  # fmt: skip
        return password
    body = {"metadata": {"name": name, "labels": labels}, "type": "Opaque", "stringData": {"password": password}}
    if await c.ctx.children.create_once(SECRET, body, owned=False) != "created":
        again = await c.ctx.client.get(SECRET, name, c.ctx.namespace)
        return _decoded(again, "password") or password
    return password


def _data(connection: Connection) -> dict[str, str]:
    values = {"host": connection.host, "port": str(connection.port), "dbname": connection.dbname,
              "username": connection.username, "password": connection.password}  # fmt: skip
    if connection.ca_pem:
        values["ca.crt"] = connection.ca_pem
    return {key: base64.b64encode(value.encode()).decode() for key, value in values.items()}


async def write(c: CloudContext, observed: Observed) -> bool:
    """Write what applications need once the provider knows the endpoint; True when the Secret is complete."""
    name = naming.connection_secret(c.ctx.name)
    current = c.ctx.children.current(SECRET, name)
    password = _decoded(current, "password") if current else None
    connection = await c.gateway.provider.connection(observed, password)
    if connection is None:
        return False
    desired = {"metadata": {"name": name, "labels": LABELS.labels(c.ctx.name)}, "type": "Opaque",
               "data": _data(connection)}  # fmt: skip
    outcome = await c.ctx.children.apply(SECRET, desired, owned=False)
    c.ledger.stage("connectionSecret", name)
    return outcome not in ("conflict", "rejected")
