"""Conversion served by kanri.runtime on the real kube-apiserver: the Greeting example's v1alpha1 and v1.

One operator (manager + conversion webhook + the example's controller) serves the whole module; the last test
stops it to show what fails when nobody serves conversion. The Greeting CRD is put back to v1 only afterwards, so
other modules of the session see the CRD they installed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import ssl
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from cryptography import x509

from examples.greeting.operator import GREETING, GREETINGS, Greeting, GreetingReconciler, greeting_crd
from kanri.local import Endpoint
from kanri.local.ports import free_port
from kanri.runtime import (
    ApiError,
    Client,
    Controller,
    Conversions,
    ConversionWebhook,
    Kind,
    Manager,
    ManagerOptions,
    RetryPolicy,
    WebhookOptions,
    install_crd,
)
from kanri.runtime._webhook_certs import CertificateStore, WebhookCertificates
from kanri.runtime.kinds import CONFIG_MAP, CRD, LEASE, NAMESPACE, SECRET
from tests.support import NotYet, eventually

OLD = Kind("example.kanri.dev/v1alpha1", "Greeting", "greetings")
PRESERVED = "example.kanri.dev/preserved-v1"


class Clock:
    """Wall-clock time that a test can move forward (certificate expiry)."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


@dataclass
class Operator:
    clock: Clock
    client: Client
    namespace: str
    manager: Manager
    webhook: ConversionWebhook
    options: WebhookOptions
    kubeconfig: str
    task: asyncio.Task[None]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def operator(control_plane: Endpoint) -> AsyncIterator[Operator]:
    kubeconfig = str(control_plane.kubeconfig)
    async with await Client.from_kubeconfig(kubeconfig) as client:
        namespace = f"conversion-{secrets.token_hex(3)}"
        await client.create(NAMESPACE, {"metadata": {"name": namespace}})
        port = free_port()
        options = WebhookOptions(namespace=namespace, secret="greeting-webhook", url=f"https://127.0.0.1:{port}/convert",
                                 host="127.0.0.1", port=port, check_interval=2.0)  # fmt: skip
        await install_crd(client, greeting_crd(options), field_manager="conversion-tests")
        manager = Manager(client, ManagerOptions(name="greeting-conversion", leader_election=False, health_port=0,
                                                 namespace=namespace))  # fmt: skip
        clock = Clock()
        webhook = ConversionWebhook(client, Conversions(GREETINGS), options, registry=manager.registry, now=clock)
        manager.add_server("conversion", webhook.run, ready=webhook.ready)
        manager.add(Controller("greeting", GreetingReconciler(manager), for_kind=GREETING).owns(CONFIG_MAP))
        task = asyncio.create_task(manager.run(handle_signals=False))
        try:
            yield Operator(clock, client, namespace, manager, webhook, options, kubeconfig, task)
        finally:
            await manager.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await _restore_v1_only(client)
            await client.delete(NAMESPACE, namespace)


async def _restore_v1_only(client: Client) -> None:
    """Other modules install the v1-only Greeting CRD and expect no webhook in the way."""
    crd = await client.get(CRD, Greeting.resource.crd_name)
    crd["spec"]["versions"] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    crd["spec"]["conversion"] = {"strategy": "None"}
    await client.replace(CRD, crd)


async def kubectl(op: Operator, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", op.kubeconfig, "-n", op.namespace, *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(stdin.encode() if stdin else None), timeout=60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_the_webhook_is_ready_once_the_crd_trusts_it_and_a_conversion_went_through(operator: Operator) -> None:
    await wait_ready(operator)
    crd = await operator.client.get(CRD, Greeting.resource.crd_name)
    conversion = crd["spec"]["conversion"]
    secret = await operator.client.get(SECRET, "greeting-webhook", operator.namespace)
    assert conversion["strategy"] == "Webhook"
    assert conversion["webhook"]["conversionReviewVersions"] == ["v1"]
    assert conversion["webhook"]["clientConfig"] == {"url": operator.options.url, "caBundle": secret["data"]["ca.crt"]}
    assert b"BEGIN CERTIFICATE" in base64.b64decode(secret["data"]["ca.crt"])
    async with aiohttp.ClientSession() as session:
        response = await session.get(f"http://127.0.0.1:{operator.manager.health_port}/readyz")
        assert response.status == 200, await response.text()


async def wait_ready(operator: Operator) -> None:
    """Until the manager (caches and conversion webhook) says ready; a failure names the webhook's last problem."""

    async def ready() -> bool:
        if operator.task.done():
            operator.task.result()  # the manager crashed: say why
        return operator.manager.ready()

    try:
        await eventually(ready, timeout=60)
    except NotYet as error:
        raise AssertionError(f"{error}; the webhook's last problem: {operator.webhook.last_problem}") from None


async def test_created_in_v1alpha1_read_in_v1_and_back_with_what_v1alpha1_cannot_hold_kept(operator: Operator) -> None:
    await wait_ready(operator)
    manifest = {"apiVersion": OLD.api_version, "kind": "Greeting", "metadata": {"name": "hello"},
                "spec": {"text": "konnichiwa", "key": "hello"}}  # fmt: skip
    code, out, err = await kubectl(operator, "create", "-f", "-", stdin=json.dumps(manifest))
    assert code == 0, err
    assert "Warning: example.kanri.dev/v1alpha1 Greeting is deprecated" in err, (out, err)

    client, ns = operator.client, operator.namespace
    stored = await client.get(GREETING, "hello", ns)
    assert stored["spec"] == {"message": "konnichiwa", "publish": {"key": "hello"}}
    configmap = await eventually(lambda: _data(client, "hello-greeting", ns), timeout=30)
    assert configmap == {"hello": "konnichiwa"}  # the controller reads v1 from its cache

    # A v1-only field survives a read-modify-write through v1alpha1.
    await client.patch(GREETING, "hello", {"spec": {"language": "ja"}}, ns)
    old = await client.get(OLD, "hello", ns)
    assert old["spec"] == {"text": "konnichiwa", "key": "hello"}
    assert json.loads(old["metadata"]["annotations"][PRESERVED])["spec"]["language"] == "ja"
    await client.patch(OLD, "hello", {"spec": {"text": "ohayou"}}, ns)
    new = await client.get(GREETING, "hello", ns)
    assert new["spec"] == {"message": "ohayou", "publish": {"key": "hello"}, "language": "ja"}
    assert PRESERVED not in (new["metadata"].get("annotations") or {})

    listed = await client.list(OLD, ns)  # a LIST converts every item
    assert [item["spec"]["text"] for item in listed[0]] == ["ohayou"]
    await eventually(lambda: _data(client, "hello-greeting", ns, {"hello": "ohayou", "language": "ja"}), timeout=30)


async def _data(
    client: Client, name: str, namespace: str, expect: dict[str, str] | None = None
) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = (await client.get(CONFIG_MAP, name, namespace)).get("data") or {}
    except ApiError as error:
        if error.not_found:
            return None
        raise
    return data if expect is None or data == expect else None


async def test_the_tls_endpoint_answers_bad_input_with_400_and_a_bad_object_with_a_failure(operator: Operator) -> None:
    await wait_ready(operator)
    secret = await operator.client.get(SECRET, "greeting-webhook", operator.namespace)
    trust = ssl.create_default_context(cadata=base64.b64decode(secret["data"]["ca.crt"]).decode())
    broken = {"apiVersion": "example.kanri.dev/v1", "kind": "Greeting", "metadata": {"name": "x", "namespace": "y"},
              "spec": {"publish": {"key": "k"}}}  # fmt: skip
    review = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
              "request": {"uid": "u-42", "desiredAPIVersion": OLD.api_version, "objects": [broken]}}  # fmt: skip
    async with aiohttp.ClientSession() as session:
        async with session.post(str(operator.options.url), data=b"{not json", ssl=trust) as junk:
            assert junk.status == 400
        async with session.post(str(operator.options.url), json=review, ssl=trust) as answered:
            assert answered.status == 200
            response = (await answered.json())["response"]
    assert response["uid"] == "u-42"
    assert response["result"]["status"] == "Failure"
    assert response["result"]["message"].startswith("converting Greeting y/x to example.kanri.dev/v1alpha1: ")
    failures = operator.manager.registry.get_sample_value(
        "kanri_conversion_webhook_objects_total", {"result": "failure"}
    )
    assert failures == 1


async def test_the_certificate_is_rotated_before_expiry_without_a_failed_conversion(operator: Operator) -> None:
    await wait_ready(operator)
    client, ns = operator.client, operator.namespace
    before = (await client.get(SECRET, "greeting-webhook", ns))["data"]["ca.crt"]
    operator.clock.offset = timedelta(days=61)  # less than a third of 90 days left
    await asyncio.wait_for(operator.webhook.rotated.wait(), timeout=30)
    operator.clock.offset = timedelta()  # the new certificate is fresh

    async def bundle_in_crd() -> str | None:
        crd = await client.get(CRD, Greeting.resource.crd_name)
        bundle: str = crd["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"]
        return bundle if bundle != before else None

    bundle = await eventually(bundle_in_crd, timeout=30)
    secret = await client.get(SECRET, "greeting-webhook", ns)
    assert bundle == secret["data"]["ca.crt"]
    new_ca, old_ca = x509.load_pem_x509_certificates(base64.b64decode(bundle))
    assert old_ca == x509.load_pem_x509_certificate(base64.b64decode(before))  # the old one is still trusted
    served = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    served.verify_directly_issued_by(new_ca)
    await wait_ready(operator)
    assert (await client.get(OLD, "hello", ns))["spec"]["text"] == "ohayou"  # converted with the new certificate


async def test_with_the_webhook_down_reads_in_v1alpha1_fail_or_miss_objects_and_v1_still_works(
    operator: Operator,
) -> None:
    await wait_ready(operator)
    client, ns = operator.client, operator.namespace
    await client.create(GREETING, {"metadata": {"name": "before", "namespace": ns}, "spec": {"message": "hi"}})
    await eventually(lambda: _names(client.list(OLD, ns)), timeout=30)  # converted while the webhook was up
    await operator.manager.stop()  # nobody serves conversion now
    assert operator.task.done()

    async with await Client.from_kubeconfig(operator.kubeconfig, retry=RetryPolicy(attempts=1)) as impatient:
        # The storage version needs no conversion: reads and writes in v1 go on (the controller is down too).
        await impatient.create(GREETING, {"metadata": {"name": "during", "namespace": ns}, "spec": {"message": "x"}})
        await impatient.patch(GREETING, "before", {"spec": {"message": "still writable"}}, ns)
        assert await _names(impatient.list(GREETING, ns)) == ["before", "during", "hello"]

        # A GET in v1alpha1 reads etcd and must convert: it fails, naming the webhook.
        for name in ("before", "during"):
            with pytest.raises(ApiError) as reading:
                await impatient.get(OLD, name, ns)
            assert reading.value.status == 500
            assert "conversion webhook for example.kanri.dev/v1, Kind=Greeting failed" in reading.value.message
        # The watch cache of v1alpha1 (resourceVersion=0, where informers start) answers, but silently lacks
        # what was written while nobody converted.
        cached = await impatient.get_path(OLD.path(ns) + "?resourceVersion=0")
        assert "during" not in [item["metadata"]["name"] for item in cached["items"]]
        # A plain LIST is served from that cache when the server can prove it fresh, else from etcd: it fails
        # (500, the webhook named) or it misses "during" — never the complete list.
        outcome: list[str] | str
        try:
            outcome = await _names(impatient.list(OLD, ns))
        except ApiError as error:
            outcome = f"{error.status} {error.message}"
        if isinstance(outcome, str):
            assert outcome.startswith("500 "), outcome
            assert "conversion webhook" in outcome, outcome
        else:
            assert "during" not in outcome
        code, _, err = await kubectl(operator, "get", "greetings.v1alpha1.example.kanri.dev", "during")
        assert code != 0
        assert "conversion webhook for example.kanri.dev/v1, Kind=Greeting failed" in err, err


async def test_a_webhook_the_api_server_cannot_reach_is_never_ready_and_says_why(operator: Operator) -> None:
    await operator.manager.stop()  # the module's replica is down (see the test before): this one is alone
    unreachable = free_port()  # the CRD will name this port; the webhook listens on another
    options = replace(operator.options, url=f"https://127.0.0.1:{unreachable}/convert", port=0)
    webhook = ConversionWebhook(operator.client, Conversions(GREETINGS), options)
    serving = asyncio.create_task(webhook.run())
    try:

        async def problem() -> str | None:
            if serving.done():
                serving.result()
            return webhook.last_problem if "conversion webhook" in (webhook.last_problem or "") else None

        reason = await eventually(problem, timeout=60)
        assert f"127.0.0.1:{unreachable}" in reason
        assert not webhook.ready()
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving


async def test_a_standby_replica_serves_conversion_and_reads_in_v1alpha1_recover(operator: Operator) -> None:
    client, ns = operator.client, operator.namespace
    await operator.manager.stop()  # (the test before stopped it already) the port is free for the next replica
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    held = {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600, "acquireTime": now, "renewTime": now}
    await client.create(LEASE, {"metadata": {"name": "greeting-standby", "namespace": ns}, "spec": held})
    standby = Manager(client, ManagerOptions(name="greeting-standby", leader_election_namespace=ns, health_port=None,
                                             namespace=ns))  # fmt: skip
    webhook = ConversionWebhook(client, Conversions(GREETINGS), operator.options)
    standby.add_server("conversion", webhook.run, ready=webhook.ready)
    standby.add(Controller("greeting", GreetingReconciler(standby), for_kind=GREETING))
    task = asyncio.create_task(standby.run(handle_signals=False))
    try:
        await wait_ready(Operator(operator.clock, client, ns, standby, webhook, operator.options, "", task))
        lease = await client.get(LEASE, "greeting-standby", ns)
        assert lease["spec"]["holderIdentity"] == "someone-else"  # not the leader, serving all the same
        during = await client.get(OLD, "during", ns)  # written while nobody converted: readable again
        assert during["spec"] == {"text": "x"}
    finally:
        await standby.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _names(listing: Awaitable[tuple[list[dict[str, Any]], str]]) -> list[str]:
    items, _ = await listing
    return sorted(item["metadata"]["name"] for item in items)


async def test_replicas_racing_to_create_or_rotate_the_certificate_end_up_serving_the_same_one(
    client: Client, namespace: str
) -> None:
    def store(valid_for: timedelta = timedelta(days=90)) -> CertificateStore:
        return CertificateStore(client, namespace, "racing", dns_names=("op.ops.svc",), valid_for=valid_for)

    replicas = [store() for _ in range(3)]
    now = datetime.now(UTC)
    first = await asyncio.gather(*(replica.current(now) for replica in replicas))
    assert first[0] == first[1] == first[2]
    assert await replicas[0].current(now) == first[0]  # not due: nothing new
    later = now + timedelta(days=61)
    # The rotation is asked at a clock 61 days ahead but issued at the real time; with a 90-day lifetime the new
    # certificate would look due at that clock too, and a replica reading it after the winner's write would rotate
    # once more (seen in a CI replica) — a fake-clock artifact. A year's lifetime keeps the new one fresh there.
    rotators = [store(timedelta(days=365)) for _ in range(3)]
    rotated = await asyncio.gather(*(replica.current(later) for replica in rotators))
    secret = WebhookCertificates.from_secret(await client.get(SECRET, "racing", namespace))
    assert rotated[0] == rotated[1] == rotated[2] == secret
    assert rotated[0] != first[0]
    assert first[0].ca_bundle in rotated[0].ca_bundle  # the previous CA stays in the bundle
