"""The reconcile step that keeps a cluster's TLS Secrets (see :mod:`kanri.postgres.tls.certificates`) in place and
current.

Each pass, from the cache: generate the CA once; generate the server certificate once, and reissue it (replace the
managed Secret) when :func:`kanri.postgres.tls.certificates.needs_renewal` says so; publish the CA certificate in
``<cluster>-ca``. A Secret without the managed mark is adopted and never written. Creates are POSTs: a 409 means
the Secret exists already (the cache had not seen it) and the next pass adopts it. ``status.tls`` records the
server certificate's expiry (written only when it changed).

Every TLS Secret read is checked before it is used (:func:`kanri.postgres.tls.certificates.server_problems` and
friends): an
adopted ``<cluster>-server`` or a user's ``<cluster>-ca`` that is wrong becomes ``InvalidServerSecret`` /
``InvalidCASecret`` naming the Secret and the key (the Degraded condition, a Warning Event), its CA is not trusted
and no pass crashes on it; a managed server Secret that is wrong is simply reissued; an unusable ``<cluster>-ca-key``
is reported and nothing is signed with it.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import structlog

from kanri.contract.secrets import SecretProblem
from kanri.postgres import names
from kanri.postgres.cluster.problems import Problem
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import of_cluster
from kanri.postgres.metrics import PostgresMetrics
from kanri.postgres.tls import certificates as tls
from kanri.postgres.tls import rotation
from kanri.postgres.tls.rotation import TlsSettings
from kanri.runtime import ApiError, Cache, Client
from kanri.runtime.kinds import POD, SECRET

log = structlog.get_logger("kanri.postgres.tls.certificates")

Obj = dict[str, Any]
INVALID_SERVER = "InvalidServerSecret"
"""``<cluster>-server`` cannot be served or verified: the key and what is wrong (never a value)."""
INVALID_CA = "InvalidCASecret"
"""``<cluster>-ca`` (published) or ``<cluster>-ca-key`` (signs) is unusable."""
_TIME = "%Y-%m-%dT%H:%M:%SZ"

Announce = Callable[[str, str], Awaitable[None]]
"""Posts a Normal Event on the cluster: (reason, message)."""


class Pass(Protocol):
    """What the step needs from the reconcile pass (:class:`kanri.postgres.cluster.reconciler.ClusterPass`)."""

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
    pods = of_cluster(step.cache, POD, step.namespace, step.name)
    addresses = [ip for pod in pods if _serves_tls(pod) and (ip := (pod.get("status") or {}).get("podIP"))]
    instances.trust(f"{step.namespace}/{step.name}", addresses, ca_cert, names.read_write_service(step.name))


def _value(secret: Obj | None, key: str) -> bytes | None:
    encoded = ((secret or {}).get("data") or {}).get(key)
    if not encoded:
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None


def _data(secret: Obj | None) -> dict[str, bytes]:
    """The Secret's decoded ``data`` (a key that is not base64 counts as missing)."""
    return {key: value for key in ((secret or {}).get("data") or {}) if (value := _value(secret, key)) is not None}


def _expiry(cert: bytes) -> dt.datetime | None:
    try:
        return tls.expiry(cert)
    except ValueError:
        return None  # not PEM: reported by the validation, nothing to record


def _managed(secret: Obj) -> bool:
    return (secret["metadata"].get("annotations") or {}).get(tls.MANAGED) == "true"


def _problems(reason: str, name: str, found: list[SecretProblem]) -> list[Problem]:
    return [Problem(reason, f"Secret {name} key {p.key} {p.message}") for p in found]


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


@dataclass
class _Kept:
    """What the managed branch of the step leaves: the CA to publish and verify with, the server Secret as it now
    is, and what was wrong with a Secret it read."""

    ca_cert: bytes | None
    server: Obj | None
    problems: list[Problem]


def _members(step: Pass, replicas: int) -> list[str]:
    """The instances the certificate names: those that exist and those ``replicas`` asks for."""
    return sorted(
        set(step.existing_instances()) | {names.instance_name(step.name, n) for n in range(1, replicas + 1)},
        key=lambda i: names.instance_number(step.name, i) or 0,
    )


async def _keep_managed(step: Pass, dns: list[str], server: Obj | None, server_faults: list[SecretProblem],
                        now: dt.datetime, settings: TlsSettings, announce: Announce | None,
                        ) -> _Kept | None:  # fmt: skip
    """The operator's own CA (generated once, rotated before it expires: :mod:`kanri.postgres.tls.rotation`) and
    server certificate (issued when missing or due, by the CA the rotation's phase signs with); None when another
    CA appeared meanwhile (the next pass signs with it, once the cache has it)."""
    cache, client, cluster, ns = step.cache, step.client, step.name, step.namespace
    found: list[Problem] = []
    key_name = names.ca_key_secret(cluster)
    key_secret = cache.get(SECRET, key_name, ns)
    ca: tls.Issued | None = None
    trusted: bytes | None = None
    if key_secret is None:
        ca = tls.build_ca(cluster, ns, now, settings.ca_lifetime)
        if not await _write(client, tls.ca_key_secret(cluster, ns, ca), None):
            return None
        log.info("generated the cluster's CA", cluster=cluster, namespace=ns)
        trusted = ca.cert
    elif key_faults := tls.ca_key_problems(_data(key_secret)):
        found += _problems(INVALID_CA, key_name, key_faults)  # nothing to sign with: the server Secret stays
    else:
        held = tls.Issued(_value(key_secret, "ca.crt") or b"", _value(key_secret, "ca.key") or b"")
        rotated = await _rotate(step, key_secret, held, now, settings, announce)
        if rotated is None:
            return None  # the key Secret changed meanwhile: the next pass reads it again
        ca, trusted = rotated
    ca_cert = trusted
    current = _value(server, "tls.crt") if server is not None else None
    why = "missing" if current is None else None
    if ca is not None and current is not None:
        why = tls.needs_renewal(current, ca.cert, dns, now) or next(
            (f"key {p.key} {p.message}" for p in server_faults), None
        )
    if ca is not None and trusted is not None and why is not None:
        lifetime = min(tls.SERVER_LIFETIME, tls.expiry(ca.cert) - now)  # never outliving the CA that signs it
        issued = tls.build_server(ca, names.read_write_service(cluster), dns, now, lifetime)
        if await _write(client, tls.server_secret(cluster, ns, issued, trusted), server):
            log.info("issued the server certificate", cluster=cluster, namespace=ns, why=why,
                     expires=tls.expiry(issued.cert).isoformat())  # fmt: skip
            server = {"data": {"tls.crt": base64.b64encode(issued.cert).decode()}}
            server_faults = []
    elif ca is not None and trusted is not None and server is not None and _value(server, "ca.crt") != trusted:
        # the trust bundle changed (a CA rotation): the pods' ca.crt follows, the certificate stays
        kept = tls.Issued(current or b"", _value(server, "tls.key") or b"")
        if await _write(client, tls.server_secret(cluster, ns, kept, trusted), server):
            log.info("updated the instances' trusted CAs", cluster=cluster, namespace=ns)
    if ca is None and server is not None and not server_faults:
        ca_cert = _value(server, "ca.crt")  # the CA key pair is unusable: keep verifying with the served CA
    return _Kept(ca_cert, server, found)


async def _rotate(step: Pass, key_secret: Obj, held: tls.Issued, now: dt.datetime, settings: TlsSettings,
                  announce: Announce | None) -> tuple[tls.Issued, bytes] | None:  # fmt: skip
    """Carry the CA rotation one phase on when it is time (:func:`kanri.postgres.tls.rotation.next_step`); the CA
    that signs server certificates now and the trust bundle. None when the key Secret could not be written."""
    cluster, ns = step.name, step.namespace
    annotations = key_secret["metadata"].get("annotations") or {}
    previous = tls.Issued(_value(key_secret, rotation.PREVIOUS_CERT) or b"", _value(key_secret, rotation.PREVIOUS_KEY)
                          or b"")  # fmt: skip
    raw_phase = annotations.get(rotation.PHASE)
    phase: rotation.Phase = raw_phase if raw_phase in ("trusting", "reissued") and previous.cert else "steady"
    since = _parse_time(annotations.get(rotation.SINCE))
    if phase != "steady" and since is None:  # a phase without its time: it counts from now
        return await _record(step, key_secret, held, previous, phase, now)
    match rotation.next_step(phase, since, rotation.due(held.cert, now), now, settings.rotation_settle):
        case "start":
            new = tls.build_ca(cluster, ns, now, settings.ca_lifetime)
            if await _record(step, key_secret, new, held, "trusting", now) is None:
                return None
            log.info("CA rotation started: clients and instances now trust the old and the new CA", cluster=cluster,
                     namespace=ns, old_expires=tls.expiry(held.cert).isoformat())  # fmt: skip
            if announce is not None:
                await announce("CARotationStarted", f"the cluster's CA expires at {tls.expiry(held.cert).isoformat()}: "
                               "a new CA is trusted beside it (ca.crt of the -ca and -server Secrets holds both); the "
                               f"server certificate moves to it in {settings.rotation_settle.total_seconds():g} s",
                               )  # fmt: skip
            return held, rotation.bundle(new.cert, held.cert)  # the old CA signs until the phase ends
        case "reissue":
            return await _record(step, key_secret, held, previous, "reissued", now)
        case "finish":
            if await _record(step, key_secret, held, None, "steady", now) is None:
                return None
            log.info("CA rotation finished: the old CA is no longer trusted", cluster=cluster, namespace=ns)
            if announce is not None:
                await announce("CARotated", "the server certificate is signed by the new CA, which alone is trusted "
                               f"now; it expires at {tls.expiry(held.cert).isoformat()}")  # fmt: skip
            return held, held.cert
    if phase == "trusting":
        return previous, rotation.bundle(held.cert, previous.cert)
    return held, rotation.bundle(held.cert, previous.cert if phase == "reissued" else None)


async def _record(step: Pass, key_secret: Obj, ca: tls.Issued, previous: tls.Issued | None, phase: rotation.Phase,
                  now: dt.datetime) -> tuple[tls.Issued, bytes] | None:  # fmt: skip
    """Write ``<cluster>-ca-key`` with ``ca``, the ``previous`` CA kept beside it, and the phase with its time; the
    signing CA and trust bundle of that phase, or None when the write lost a race."""
    secret = tls.ca_key_secret(step.name, step.namespace, ca)
    if previous is not None and phase != "steady":
        secret["data"][rotation.PREVIOUS_CERT] = base64.b64encode(previous.cert).decode()
        secret["data"][rotation.PREVIOUS_KEY] = base64.b64encode(previous.key).decode()
        secret["metadata"]["annotations"] |= {rotation.PHASE: phase, rotation.SINCE: now.strftime(_TIME)}
    if not await _write(step.client, secret, key_secret):
        return None
    if phase == "trusting" and previous is not None:
        return previous, rotation.bundle(ca.cert, previous.cert)
    return ca, rotation.bundle(ca.cert, previous.cert if previous is not None and phase != "steady" else None)


def _parse_time(raw: object) -> dt.datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        return dt.datetime.strptime(raw, _TIME).replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def _trust(step: Pass, instances: object, ca_cert: bytes | None) -> list[Problem]:
    """The instance client verifies the pods with ``ca_cert``; a CA it refuses is named, never a crash loop."""
    try:
        trust_pods(step, instances, ca_cert)
    except (ssl.SSLError, ValueError) as exc:  # checked above; never a crash loop should the client still refuse it
        log.warning("the instance client refused the cluster's CA", cluster=step.name, namespace=step.namespace,
                    error=str(exc))  # fmt: skip
        trust_pods(step, instances, None)
        return [Problem(INVALID_SERVER, f"Secret {names.server_secret(step.name)} key ca.crt is not a CA certificate "
                        "the operator can verify the instances with")]  # fmt: skip
    return []


async def ensure_tls(
    step: Pass,
    replicas: int,
    instances: object = None,
    metrics: PostgresMetrics | None = None,
    now: dt.datetime | None = None,
    settings: TlsSettings | None = None,
    announce: Announce | None = None,
) -> list[Problem]:
    """The step: CA, server certificate (renewed when due), published CA certificate, ``status.tls``. The
    certificate names the instances that exist and the ``replicas`` the spec asks for (a scale-up's new pod is
    covered before it starts). ``instances`` (the instance client) learns which pods to verify with the CA;
    ``metrics`` gets the certificate's expiry; ``settings`` the CA's lifetime and the rotation's pace; ``announce``
    posts the rotation's Events. Returns what is wrong with the TLS Secrets it read
    (``InvalidServerSecret``, ``InvalidCASecret``): an unusable Secret is named, never trusted, never a crash."""
    now = now or dt.datetime.now(dt.UTC)
    cluster, ns = step.name, step.namespace
    found: list[Problem] = []
    server_name = names.server_secret(cluster)
    server = step.cache.get(SECRET, server_name, ns)
    server_faults = tls.server_problems(_data(server), now) if server is not None else []
    ca_cert: bytes | None
    if server is not None and not _managed(server):
        # adopted (a user's or cert-manager's): publish its CA, write nothing; a fault is named, not repaired
        found += _problems(INVALID_SERVER, server_name, server_faults)
        ca_cert = None if any(p.key == "ca.crt" for p in server_faults) else _value(server, "ca.crt")
    else:
        dns = tls.dns_names(cluster, ns, _members(step, replicas))
        kept = await _keep_managed(step, dns, server, server_faults, now, settings or TlsSettings(), announce)
        if kept is None:
            return found  # another CA is there already: sign with it, once the cache has it
        ca_cert, server = kept.ca_cert, kept.server
        found += kept.problems
    found += await _publish(step, ca_cert)
    found += _trust(step, instances, ca_cert)
    cert = _value(server, "tls.crt") if server is not None else None
    if cert is not None and (expires := _expiry(cert)) is not None:
        if metrics is not None:
            metrics.certificate_expires(ns, cluster, expires)
        await _record_expiry(step, expires)
    return found


async def _publish(step: Pass, ca_cert: bytes | None) -> list[Problem]:
    """``<cluster>-ca``: written while it is the operator's; a user's is checked (clients verify with it)."""
    name = names.ca_secret(step.name)
    published = step.cache.get(SECRET, name, step.namespace)
    if ca_cert and (published is None or (_managed(published) and _value(published, "ca.crt") != ca_cert)):
        await _write(step.client, tls.ca_secret(step.name, step.namespace, ca_cert), published)
        return []
    if published is None or _managed(published):
        return []
    if faults := tls.ca_problems(_data(published)):
        return _problems(INVALID_CA, name, faults)
    if ca_cert and _value(published, "ca.crt") != ca_cert:
        why = SecretProblem("ca.crt", f"is not the CA of {names.server_secret(step.name)}: clients verifying "
                            "the server with it fail")  # fmt: skip
        return _problems(INVALID_CA, name, [why])
    return []


async def _record_expiry(step: Pass, expires: dt.datetime) -> None:
    value = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
    if (step.status.get("tls") or {}).get("serverCertificateExpires") == value:
        return
    patch = {"status": {"tls": {"serverCertificateExpires": value}}}
    await step.client.patch_status(POSTGRES_CLUSTER, step.name, patch, step.namespace)
    step.status = {**step.status, "tls": {"serverCertificateExpires": value}}
