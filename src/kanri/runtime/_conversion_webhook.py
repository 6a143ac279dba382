"""The conversion webhook: answers the API server's ConversionReviews over TLS, in every replica of the operator.

Besides serving ``/convert`` it keeps what the API server needs to call it current: the serving certificate (from
the shared Secret, rotated before expiry, see ``_webhook_certs``) and each CRD's ``spec.conversion`` (strategy
Webhook, this webhook's address and ``caBundle``) — re-patched whenever they drift, e.g. after a CRD was re-applied
from a chart without a ``caBundle``. It is ready only once a conversion has gone through: its own TLS endpoint
answered a review, and a stored object was read in every served non-storage version through the API server.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from kanri.runtime._client import Client
from kanri.runtime._conversion import Conversion, Conversions
from kanri.runtime._crd import ResourceInfo
from kanri.runtime._errors import ApiError
from kanri.runtime._kinds import CRD, Kind
from kanri.runtime._webhook_certs import CertificateStore, WebhookCertificates

__all__ = ["ConversionWebhook", "WebhookOptions", "review_response"]

log = structlog.get_logger("kanri.conversion")
Obj = dict[str, Any]
_REVIEW_VERSION = "apiextensions.k8s.io/v1"
_PATH = "/convert"
# A review of a LIST carries every object at once (1,000 PostgresClusters are a few MB); aiohttp's default is 1 MiB.
_MAX_REQUEST = 256 * 1024 * 1024
_SELF_TEST_TIMEOUT = 45.0
"""Seconds one self-test may take: the API server gives a conversion call 30 s, and a read may wait for one."""


def review_response(conversions: Conversions, review: Mapping[str, Any]) -> Obj:
    """The ConversionReview answering ``review``: every object converted, or ``result.status: Failure`` with a
    message naming the first object that could not be (the API server then fails the whole request)."""
    request = review.get("request") or {}
    uid = str(request.get("uid", ""))
    desired = str(request.get("desiredAPIVersion", ""))
    converted: list[Obj] = []
    for obj in request.get("objects") or []:
        try:
            converted.append(conversions.convert(obj, desired))
        except Exception as error:  # any failure is an answer, never a crash of the webhook
            meta = (obj.get("metadata") or {}) if isinstance(obj, Mapping) else {}
            where = "/".join(part for part in (meta.get("namespace"), meta.get("name")) if part) or "<unnamed>"
            kind = obj.get("kind", "object") if isinstance(obj, Mapping) else "object"
            message = f"converting {kind} {where} to {desired}: {error}"
            log.warning("conversion failed", uid=uid, error=message)
            response: Obj = {"uid": uid, "convertedObjects": [], "result": {"status": "Failure", "message": message}}
            return {"apiVersion": _REVIEW_VERSION, "kind": "ConversionReview", "response": response}
    response = {"uid": uid, "convertedObjects": converted, "result": {"status": "Success"}}
    return {"apiVersion": _REVIEW_VERSION, "kind": "ConversionReview", "response": response}


@dataclass(frozen=True)
class WebhookOptions:
    """Where the conversion webhook listens and how the API server reaches it.

    In a cluster, give ``service`` (the Service in front of every replica, in ``namespace``): the CRDs then name it
    and the certificate carries its DNS names. Outside one (tests, a local control plane), give ``url``
    (``https://127.0.0.1:9443/convert``). The certificates live in the Secret ``secret`` in ``namespace``.
    """

    namespace: str
    secret: str
    service: str | None = None
    url: str | None = None
    host: str = "0.0.0.0"
    """Where to listen: every address, as the API server calls the pod's IP through the Service."""
    port: int = 9443
    """0 picks a free port (see ``ConversionWebhook.port``); with ``url``, give the port the URL names."""
    certificate_lifetime: timedelta = timedelta(days=90)
    check_interval: float = 60.0
    """How often the certificate's expiry and the CRDs' conversion settings are checked (1 s until ready)."""

    def __post_init__(self) -> None:
        if (self.service is None) == (self.url is None):
            raise ValueError("a conversion webhook is reached through exactly one of service= or url=")

    def client_config(self) -> Obj:
        """The CRD's ``spec.conversion.webhook.clientConfig`` without ``caBundle``."""
        if self.url is not None:
            return {"url": self.url}
        return {"service": {"name": self.service, "namespace": self.namespace, "path": _PATH, "port": self.port}}

    def hosts(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(DNS names, IP addresses) the serving certificate must name."""
        if self.url is not None:
            host = urlsplit(self.url).hostname or ""
            return ((), (host,)) if _is_ip(host) else ((host,), ())
        name, namespace = self.service, self.namespace
        return (f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local", f"{name}.{namespace}"), ()


class ConversionWebhook:
    """Serves ``conversions`` to the API server. Run it in every replica: ``manager.add_server("conversion",
    webhook.run, ready=webhook.ready)``; the client needs get/create/update on the Secret, and get/patch on the
    CRDs of the converted kinds. ``now`` decides when the certificate is due for renewal (tests move it)."""

    def __init__(
        self,
        client: Client,
        conversions: Conversions,
        options: WebhookOptions,
        *,
        registry: CollectorRegistry | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.client, self.conversions, self.options, self._now = client, conversions, options, now
        dns_names, ip_addresses = options.hosts()
        self._store = CertificateStore(
            client, options.namespace, options.secret, dns_names=dns_names, ip_addresses=ip_addresses,
            valid_for=options.certificate_lifetime,
        )  # fmt: skip
        self._certs: WebhookCertificates | None = None
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ready = False
        self.port: int | None = None
        self.last_problem: str | None = None
        """Why the webhook is not ready (or the last check failed), for logs and tests."""
        self.rotated = asyncio.Event()
        """Set each time this replica starts serving a new certificate after its first one."""
        registry = registry if registry is not None else CollectorRegistry()
        self._seconds = Histogram(
            "kanri_conversion_webhook_duration_seconds", "Time to answer one ConversionReview.", ["result"],
            registry=registry, buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )  # fmt: skip
        self._objects = Counter(
            "kanri_conversion_webhook_objects_total", "Objects converted (or not) by the webhook.", ["result"],
            registry=registry,
        )  # fmt: skip

    def ready(self) -> bool:
        """True once a conversion went through end to end, and while the last check found nothing wrong."""
        return self._ready

    async def run(self) -> None:
        """Serve until cancelled, keeping the certificate and the CRDs' conversion settings current."""
        self._certs = await self._first_certificates()
        self._load(self._certs)
        app = web.Application(client_max_size=_MAX_REQUEST)
        app.router.add_post(_PATH, self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.options.host, self.options.port, ssl_context=self._ssl)
        await site.start()
        self.port = int(runner.addresses[0][1])
        log.info("conversion webhook serving", port=self.port, kinds=[c.kind for c in self.conversions])
        try:
            while True:
                await self._check()
                await asyncio.sleep(self.options.check_interval if self._ready else 1.0)
        finally:
            self._ready = False
            await runner.cleanup()

    async def _first_certificates(self) -> WebhookCertificates:
        """The certificates to start with, waiting out an API server that is not reachable yet (not ready meanwhile)."""
        delay = 0.5
        while True:
            try:
                return await self._store.current(self._now())
            except (ApiError, OSError, RuntimeError) as error:
                self.last_problem = f"no certificate yet: {error}"
                log.warning("conversion webhook waiting for its certificate", error=str(error), retry_in=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    async def _check(self) -> None:
        """One pass: rotate if due, make the CRDs point at us with our CA, then prove a conversion works."""
        try:
            certs = await self._store.current(self._now())
            if certs != self._certs:
                log.info("conversion webhook certificate rotated", secret=self.options.secret)
                self._load(certs)
                self._certs = certs
                self.rotated.set()
            await self._patch_crds(certs)
            async with asyncio.timeout(_SELF_TEST_TIMEOUT):  # a hung read is a failed check, not a silent one
                await self._self_test(certs)
        except Exception as error:  # any failed check means "not ready", never a dead webhook
            problem = f"{type(error).__name__}: {error}"
            if self._ready or problem != self.last_problem:  # each new reason once, so a stuck replica says why
                log.warning("conversion webhook check failed", error=problem, ready=False)
            self.last_problem, self._ready = problem, False
            return
        if not self._ready:
            log.info("conversion webhook ready")
        self.last_problem, self._ready = None, True

    def _load(self, certs: WebhookCertificates) -> None:
        # ssl wants files; new handshakes use the new pair, connections already open keep theirs.
        with tempfile.TemporaryDirectory(prefix="kanri-webhook-") as folder:
            cert, key = Path(folder, "tls.crt"), Path(folder, "tls.key")
            cert.write_bytes(certs.cert)
            key.touch(mode=0o600)
            key.write_bytes(certs.key)
            self._ssl.load_cert_chain(cert, key)

    async def _patch_crds(self, certs: WebhookCertificates) -> None:
        client_config = {**self.options.client_config(), "caBundle": base64.b64encode(certs.ca_bundle).decode()}
        for conversion in self.conversions:
            name = conversion.hub.resource.crd_name
            patch = conversion_patch(await self.client.get(CRD, name), client_config)
            if patch is not None:
                await self.client.patch(CRD, name, patch)
                log.info("CRD conversion settings updated", crd=name)

    async def _self_test(self, certs: WebhookCertificates) -> None:
        """Our TLS endpoint answers a review, verified with the bundle the CRDs carry; then the API server converts
        a stored object for a read in each served non-storage version."""
        verify = ssl.create_default_context(cadata=certs.ca_bundle.decode())
        dns_names, ips = self.options.hosts()
        review = {"apiVersion": _REVIEW_VERSION, "kind": "ConversionReview",
                  "request": {"uid": "self-test", "desiredAPIVersion": "self/test", "objects": []}}  # fmt: skip
        host = "127.0.0.1" if self.options.host in ("0.0.0.0", "::", "") else self.options.host
        url = f"https://{host}:{self.port}{_PATH}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            sent = session.post(url, json=review, ssl=verify, server_hostname=(dns_names or ips)[0])
            async with sent as response:
                answer = await response.json()
        if answer.get("response", {}).get("uid") != "self-test":
            raise RuntimeError(f"the webhook's own endpoint answered {answer!r}")
        for conversion in self.conversions:
            await self._read_through_api_server(conversion)

    async def _read_through_api_server(self, conversion: Conversion[Any]) -> None:
        """GET one stored object in every served non-storage version: a GET reads etcd and converts through the
        webhook (a LIST may be answered from the version's watch cache, converted when the object was written)."""
        kinds = {model.resource.api_version: _kind_of(model.resource) for model in conversion.resources}
        storage = next(model.resource for model in conversion.resources if model.resource.storage)
        page = await self.client.get_path(kinds[storage.api_version].path(None) + "?limit=1")
        items = page.get("items") or []
        if not items:
            return  # nothing stored: the API server has nothing to convert, so nothing to prove yet
        name, namespace = items[0]["metadata"]["name"], items[0]["metadata"].get("namespace")
        for model in conversion.resources:
            if model.resource.served and not model.resource.storage:
                await self.client.get(kinds[model.resource.api_version], name, namespace)

    async def _handle(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            review = orjson.loads(await request.read())
        except orjson.JSONDecodeError as error:
            return web.Response(status=400, text=f"not a ConversionReview: {error}")
        if not isinstance(review, dict) or review.get("kind") != "ConversionReview":
            return web.Response(status=400, text="not a ConversionReview")
        answer = review_response(self.conversions, review)
        response = answer["response"]
        result = "success" if response["result"]["status"] == "Success" else "failure"
        count = len(response["convertedObjects"]) if result == "success" else 1
        self._objects.labels(result).inc(count)
        self._seconds.labels(result).observe(time.perf_counter() - started)
        return web.Response(body=orjson.dumps(answer), content_type="application/json")


def _kind_of(info: ResourceInfo) -> Kind:
    return Kind(info.api_version, info.kind, info.plural, namespaced=info.scope == "Namespaced")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def conversion_patch(crd: Mapping[str, Any], client_config: Mapping[str, Any]) -> Obj | None:
    """The merge patch that points ``crd``'s conversion at this webhook (``client_config``, ``caBundle`` included),
    or None when nothing is to change: it already does, or the CRD serves one version (nothing to convert, and
    turning conversion back on would undo an operator that took the CRD back to one version, naming a webhook that
    may be gone with it)."""
    spec = crd.get("spec") or {}
    if sum(1 for version in spec.get("versions") or [] if version.get("served")) < 2:
        return None
    webhook = (spec.get("conversion") or {}).get("webhook") or {}
    if webhook.get("clientConfig") == client_config and webhook.get("conversionReviewVersions") == ["v1"]:
        return None
    # A merge patch keeps the other address form unless it is nulled: a CRD names a url or a service, not both.
    other = "service" if "url" in client_config else "url"
    return {"spec": {"conversion": {"strategy": "Webhook", "webhook": {
        "clientConfig": {**client_config, other: None}, "conversionReviewVersions": ["v1"],
    }}}}  # fmt: skip
