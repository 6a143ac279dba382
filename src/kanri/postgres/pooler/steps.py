"""The thin steps of a PostgresPooler pass: each reads the cache, writes through the pass's child writer or the
instance client, and hands back what the next step needs. The reconciler (:mod:`.controller`) wires them.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from typing import Any, Protocol, runtime_checkable

import structlog

from kanri.contract.pooler import PoolerRoleRequest
from kanri.contract.scram import verifier
from kanri.kit import PassContext
from kanri.postgres import names as pg_names
from kanri.postgres.api.v1alpha1.postgres_pooler import PostgresPoolerSpec
from kanri.postgres.cluster.instances import instance_endpoint
from kanri.postgres.credentials.secrets import secret_value
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.pooler import children, names
from kanri.postgres.pooler.config import AUTH_FILE, CONFIG_FILE, auth_file, config_hash, render
from kanri.postgres.tls import certificates as tls
from kanri.runtime import get_condition
from kanri.runtime.kinds import CONFIG_MAP, DEPLOYMENT, SECRET, SERVICE

__all__ = [
    "PoolerRoleClient",
    "auth_version",
    "ensure_auth_secret",
    "ensure_children",
    "ensure_role",
    "ensure_tls",
    "role_version",
]

Obj = dict[str, Any]
log = structlog.get_logger("kanri.postgres.pooler")


@runtime_checkable
class PoolerRoleClient(Protocol):
    """The one instance action the pooler needs (``kanri.postgres.cluster.instances.HttpInstanceClient`` has it)."""

    async def ensure_pooler_role(self, address: str, token: str, request: PoolerRoleRequest) -> bool: ...


def auth_version(secret: Obj | None) -> str | None:
    """The auth Secret's identity and version: a new Secret, or an edited one, is confirmed again."""
    if secret is None:
        return None
    meta = secret["metadata"]
    return f"{meta.get('uid')}/{meta.get('resourceVersion')}"


def role_version(secret: Obj | None, cluster: Obj) -> str | None:
    """What the primary confirms: the auth Secret's version on this cluster (a cluster deleted and made again under
    the same name, from a backup say, has a new uid and is asked again)."""
    version = auth_version(secret)
    return None if version is None else f"{version}@{cluster['metadata'].get('uid')}"


async def ensure_auth_secret(ctx: PassContext) -> Obj | None:
    """The lookup role's password, generated once (an existing Secret is kept as it is); the Secret as cached."""
    name = names.auth_secret(ctx.name)
    if ctx.cache.get(SECRET, name, ctx.namespace) is None:
        password = secrets.token_urlsafe(32)
        outcome = await ctx.children.create_once(SECRET, children.auth_secret(ctx.name, ctx.namespace, password,
                                                                              auth_file(password)))  # fmt: skip
        if outcome == "created":
            await ctx.events.normal(ctx.obj, "CreatedSecret", f"generated Secret {name}")
    return ctx.cache.get(SECRET, name, ctx.namespace)


async def ensure_tls(ctx: PassContext, cluster: str, now: dt.datetime) -> bytes | None:
    """The pooler's certificate, issued by the cluster's CA for the Service's names, reissued when due (the
    cluster's rule: a third of its lifetime left, a name missing, another CA). Its certificate; None without a CA
    key to issue with."""
    ca = ctx.cache.get(SECRET, pg_names.ca_key_secret(cluster), ctx.namespace)
    ca_cert, ca_key = secret_value(ca, "ca.crt"), secret_value(ca, "ca.key")
    if ca_cert is None or ca_key is None:
        return None
    dns = children.dns_names(ctx.name, ctx.namespace)
    current = ctx.cache.get(SECRET, names.tls_secret(ctx.name), ctx.namespace)
    cert = secret_value(current, "tls.crt")
    if cert is not None and secret_value(current, "ca.crt") == ca_cert:
        why = tls.needs_renewal(cert.encode(), ca_cert.encode(), dns, now)
        if why is None:
            return cert.encode()
        log.info("pooler certificate reissued", pooler=ctx.name, why=why)
    issued = tls.build_server(tls.Issued(ca_cert.encode(), ca_key.encode()), f"{ctx.name}.{ctx.namespace} pooler",
                              dns, now)  # fmt: skip
    secret = children.tls_secret(ctx.name, ctx.namespace, issued.cert, issued.key, ca_cert.encode())
    await ctx.children.apply(SECRET, secret)
    return issued.cert


def _primary(cluster: Obj) -> str | None:
    return ((cluster.get("status") or {}).get("currentPrimary")) or None


def cluster_ready(cluster: Obj | None) -> bool:
    """The cluster's own Ready condition is True."""
    condition = get_condition(((cluster or {}).get("status") or {}).get("conditions"), "Ready")
    return condition is not None and condition.get("status") == "True"


async def ensure_role(ctx: PassContext, instances: PoolerRoleClient, cluster: Obj, secret: Obj | None,
                      confirmed: str | None, database: str) -> str | None:  # fmt: skip
    """Ask the primary for the lookup role when the auth Secret (or the cluster) changed since it was last confirmed;
    the version confirmed now (unchanged when there is nothing to do or the primary did not answer: asked again)."""
    version = role_version(secret, cluster)
    password = secret_value(secret, "password")
    if version is None or password is None or version == confirmed:
        return confirmed
    primary = _primary(cluster)
    endpoint = None if primary is None else instance_endpoint(ctx.cache, ctx.namespace, cluster["metadata"]["name"],
                                                              primary)  # fmt: skip
    if endpoint is None:
        ctx.requeue(5.0)
        return confirmed
    request = PoolerRoleRequest(verifier=verifier(password), databases=[database])
    if not await instances.ensure_pooler_role(*endpoint, request):
        ctx.requeue(5.0)
        return confirmed
    await ctx.events.normal(ctx.obj, "PoolerRoleReady", f"the primary {primary} has the pooler's lookup role")
    return version


async def ensure_children(ctx: PassContext, spec: PostgresPoolerSpec, cert: bytes, auth: str,
                          database: str = "app") -> str:  # fmt: skip
    """pgbouncer.ini, the Service and the Deployment whose pod template carries the hash of what the pods read (the
    ini, the certificate, the auth Secret's version); that hash. ``database``: where the lookup role is made."""
    ini = render(spec, ctx.namespace)
    digest = config_hash({CONFIG_FILE: ini.encode(), "tls.crt": cert, AUTH_FILE: auth.encode()})
    await ctx.children.apply(CONFIG_MAP, children.config_map(ctx.name, ctx.namespace, ini))
    await ctx.children.apply(SERVICE, children.service(ctx.name, ctx.namespace))
    pods = children.deployment(ctx.name, ctx.namespace, spec, digest, image=children.image(os.environ),
                               database=database)  # fmt: skip
    await ctx.children.apply(DEPLOYMENT, pods)
    return digest


def cluster_of(ctx: PassContext, name: str) -> Obj | None:
    return ctx.cache.get(POSTGRES_CLUSTER, name, ctx.namespace)
