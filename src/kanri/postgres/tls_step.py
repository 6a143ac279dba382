"""The reconcile step that keeps a cluster's TLS Secrets (see :mod:`kanri.postgres.tls`) in place and current.

Each pass, from the cache: generate the CA once; generate the server certificate once, and reissue it (replace the
managed Secret) when :func:`kanri.postgres.tls.needs_renewal` says so; publish the CA certificate in
``<cluster>-ca``. A Secret without the managed mark is adopted and never written. Creates are POSTs: a 409 means
the Secret exists already (the cache had not seen it) and the next pass adopts it. ``status.tls`` records the
server certificate's expiry (written only when it changed).
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import structlog

from kanri.postgres import names, tls
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import CLUSTER
from kanri.postgres.metrics import PostgresMetrics
from kanri.runtime import ApiError, Cache, Client
from kanri.runtime.kinds import POD, SECRET

log = structlog.get_logger("kanri.postgres.tls")

Obj = dict[str, Any]


class Pass(Protocol):
    """What the step needs from the reconcile pass (:class:`kanri.postgres.reconciler.ClusterPass`)."""

    name: str
    namespace: str
    status: Obj

    @property
    def cache(self) -> Cache: ...

    @property
    def client(self) -> Client: ...

    def existing_instances(self) -> list[str]: ...


@runtime_checkable
class Trusting(Protocol):
    """An instance client that speaks HTTPS to a cluster's pods (the HttpInstanceClient)."""

    def trust(self, cluster: str, addresses: Iterable[str], ca_pem: bytes | None, server_name: str) -> None: ...


def _serves_tls(pod: Obj) -> bool:
    """The pod's instance manager was given a certificate (its StatefulSet predates TLS otherwise)."""
    for container in (pod.get("spec") or {}).get("containers") or ():
        if any(env.get("name") == "KANRI_TLS_DIR" for env in container.get("env") or ()):
            return True
    return False


def trust_pods(step: Pass, instances: object, ca_cert: bytes | None) -> None:
    """Tell the instance client which of the cluster's pods speak HTTPS, and the CA to verify them with."""
    if not isinstance(instances, Trusting):
        return
    pods = step.cache.list(POD, step.namespace, {CLUSTER: step.name})
    addresses = [ip for pod in pods if _serves_tls(pod) and (ip := (pod.get("status") or {}).get("podIP"))]
    instances.trust(f"{step.namespace}/{step.name}", addresses, ca_cert, names.read_write_service(step.name))


def _value(secret: Obj | None, key: str) -> bytes | None:
    encoded = ((secret or {}).get("data") or {}).get(key)
    return base64.b64decode(encoded) if encoded else None


def _managed(secret: Obj) -> bool:
    return (secret["metadata"].get("annotations") or {}).get(tls.MANAGED) == "true"


async def _write(client: Client, secret: Obj, existing: Obj | None) -> bool:
    """Create ``secret`` (or replace the managed ``existing``); False when someone else got there first."""
    try:
        if existing is None:
            await client.create(SECRET, secret)
        else:
            secret["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            await client.replace(SECRET, secret)
    except ApiError as exc:
        if exc.status == 409:
            return False  # exists or changed since the cache saw it: the next pass looks again
        raise
    return True


async def ensure_tls(
    step: Pass,
    replicas: int,
    instances: object = None,
    metrics: PostgresMetrics | None = None,
    now: dt.datetime | None = None,
) -> None:
    """The step: CA, server certificate (renewed when due), published CA certificate, ``status.tls``. The
    certificate names the instances that exist and the ``replicas`` the spec asks for (a scale-up's new pod is
    covered before it starts). ``instances`` (the instance client) learns which pods to verify with the CA;
    ``metrics`` gets the certificate's expiry."""
    now = now or dt.datetime.now(dt.UTC)
    cache, client, cluster, ns = step.cache, step.client, step.name, step.namespace
    members = sorted(
        set(step.existing_instances()) | {names.instance_name(cluster, n) for n in range(1, replicas + 1)},
        key=lambda i: names.instance_number(cluster, i) or 0,
    )
    dns = tls.dns_names(cluster, ns, members)
    server = cache.get(SECRET, names.server_secret(cluster), ns)
    if server is not None and not _managed(server):
        ca_cert = _value(server, "ca.crt")  # adopted (a user's or cert-manager's): publish its CA, write nothing
    else:
        key_secret = cache.get(SECRET, names.ca_key_secret(cluster), ns)
        if key_secret is None:
            ca = tls.build_ca(cluster, ns, now)
            if not await _write(client, tls.ca_key_secret(cluster, ns, ca), None):
                return  # another CA is there already: sign with it, once the cache has it
            log.info("generated the cluster's CA", cluster=cluster, namespace=ns)
        else:
            ca = tls.Issued(_value(key_secret, "ca.crt") or b"", _value(key_secret, "ca.key") or b"")
        ca_cert = ca.cert
        current = _value(server, "tls.crt") if server is not None else None
        why = "missing" if current is None else tls.needs_renewal(current, ca.cert, dns, now)
        if why is not None:
            issued = tls.build_server(ca, names.read_write_service(cluster), dns, now)
            if await _write(client, tls.server_secret(cluster, ns, issued, ca.cert), server):
                log.info("issued the server certificate", cluster=cluster, namespace=ns, why=why,
                         expires=tls.expiry(issued.cert).isoformat())  # fmt: skip
                server = {"data": {"tls.crt": base64.b64encode(issued.cert).decode()}}
    published = cache.get(SECRET, names.ca_secret(cluster), ns)
    if ca_cert and (published is None or (_managed(published) and _value(published, "ca.crt") != ca_cert)):
        await _write(client, tls.ca_secret(cluster, ns, ca_cert), published)
    trust_pods(step, instances, ca_cert)
    cert = _value(server, "tls.crt") if server is not None else None
    if cert is not None:
        expires = tls.expiry(cert)
        if metrics is not None:
            metrics.certificate_expires(ns, cluster, expires)
        await _record_expiry(step, expires)


async def _record_expiry(step: Pass, expires: dt.datetime) -> None:
    value = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
    if (step.status.get("tls") or {}).get("serverCertificateExpires") == value:
        return
    patch = {"status": {"tls": {"serverCertificateExpires": value}}}
    await step.client.patch_status(POSTGRES_CLUSTER, step.name, patch, step.namespace)
    step.status = {**step.status, "tls": {"serverCertificateExpires": value}}
