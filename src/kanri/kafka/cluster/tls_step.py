"""A KafkaCluster's TLS listener: the cluster's own CA and the brokers' certificate (``spec.tls.enabled``).

- ``<name>-ca-key``: the CA's certificate and key, made once and read only by the operator;
- ``<name>-ca``: the CA's certificate (``ca.crt``) alone, for clients to trust;
- ``<name>-tls``: the brokers' certificate (``tls.crt``, ``tls.key``, ``ca.crt``) for every pod under the headless
  Service and the bootstrap Service (:func:`.children.tls_dns_names`), reissued from the same CA once a third of its
  lifetime is left, a name is missing or another CA signed it (:func:`kanri.kit.tls.needs_renewal`).

The certificate's hash goes into the pod template, so a new certificate is a new revision that the rolling restart
loads one broker at a time behind the ``min.insync.replicas`` gate. Keys never leave Secrets: not in status, Events
or logs. A CA Secret that does not parse is refused (``InvalidCASecret``), never replaced: clients trust it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from datetime import UTC, datetime
from typing import Any

from kanri import kit
from kanri import runtime as kr
from kanri.kafka.api import LABELS
from kanri.kafka.cluster import children
from kanri.kafka.cluster.context import ClusterContext
from kanri.kit import tls
from kanri.runtime import format_time
from kanri.runtime.kinds import SECRET

INVALID_CA = "InvalidCASecret"


def _secret(cluster: str, name: str, data: dict[str, bytes]) -> dict[str, Any]:
    encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
    return {"metadata": {"name": name, "labels": LABELS.labels(cluster)}, "type": "Opaque", "data": encoded}


def _read(secret: dict[str, Any] | None, *keys: str) -> list[bytes] | None:
    data = (secret or {}).get("data") or {}
    try:
        return [base64.b64decode(data[key], validate=True) for key in keys]
    except (KeyError, binascii.Error):
        return None


def _authority(secret: dict[str, Any] | None) -> tls.Issued | None:
    found = _read(secret, "tls.crt", "tls.key")
    if found is None:
        return None
    issued = tls.Issued(*found)
    try:
        tls.expiry(issued.cert)
    except ValueError:
        return None
    return issued


async def _ca(ctx: ClusterContext, now: datetime) -> tls.Issued | None:
    """The cluster's CA: the one on record, else a new one (created once: a second operator's CA loses the race and
    the winner's is read back)."""
    name = children.ca_key_name(ctx.name)
    existing = ctx.cache.get(SECRET, name, ctx.namespace)
    if existing is None:
        made = tls.build_ca(f"{ctx.name}.{ctx.namespace} kanri kafka CA", now)
        body = _secret(ctx.name, name, {"tls.crt": made.cert, "tls.key": made.key})
        if await ctx.children.create_once(SECRET, body) == "created":
            await ctx.events.normal(ctx.obj, "CertificateAuthorityCreated", f"the cluster's CA in Secret {name} "
                                    f"(valid until {format_time(tls.expiry(made.cert))}); clients trust "
                                    f"{children.ca_name(ctx.name)}")  # fmt: skip
            return made
        existing = await ctx.client.get(SECRET, name, ctx.namespace)
    authority = _authority(existing)
    if authority is None:
        message = f"Secret {name} holds no usable CA (tls.crt and tls.key, PEM); it is not replaced, because " \
            "clients trust it: fix it, or delete it and the CA Secret clients read to have a new CA made"  # fmt: skip
        ctx.problems.add(kit.Problem(INVALID_CA, message))
    return authority


def tls_hash(cert: bytes) -> str:
    return hashlib.sha256(cert).hexdigest()[:16]


async def step(ctx: ClusterContext) -> kr.Result | None:
    """Before the children: the StatefulSet carries the certificate's hash."""
    if not ctx.spec.tls.enabled:
        ctx.tls_hash = None
        ctx.ledger.stage("tls", None)
        return None
    now = datetime.now(UTC)
    authority = await _ca(ctx, now)
    if authority is None:
        return None
    await ctx.children.apply(SECRET, _secret(ctx.name, children.ca_name(ctx.name), {"ca.crt": authority.cert}))
    names = children.tls_dns_names(ctx.name, ctx.namespace)
    current = _read(ctx.cache.get(SECRET, children.tls_name(ctx.name), ctx.namespace), "tls.crt", "tls.key")
    reason = "there is none yet" if current is None else tls.needs_renewal(current[0], authority.cert, names, now)
    cert = current[0] if current is not None else b""
    if reason is not None:
        issued = tls.build_server(authority, names, now)
        body = _secret(ctx.name, children.tls_name(ctx.name),
                       {"tls.crt": issued.cert, "tls.key": issued.key, "ca.crt": authority.cert})  # fmt: skip
        await ctx.children.apply(SECRET, body)
        cert = issued.cert
        await ctx.events.normal(ctx.obj, "CertificateIssued", f"the brokers' certificate in Secret "
                                f"{children.tls_name(ctx.name)} was issued because {reason}; valid until "
                                f"{format_time(tls.expiry(cert))}")  # fmt: skip
    ctx.tls_hash = tls_hash(cert)
    ctx.ledger.stage("tls", {"bootstrap": children.tls_bootstrap(ctx.name, ctx.namespace),
                             "caSecret": children.ca_name(ctx.name),
                             "caExpires": format_time(tls.expiry(authority.cert)),
                             "serverExpires": format_time(tls.expiry(cert))})  # fmt: skip
    return None
