"""Benchmark conversion: what listing N objects in a non-storage version costs, through kanri's webhook.

    .venv/bin/python bench/conversion.py --objects 1000 [--repeat 5]

A fresh control plane (temp data dir, removed at the end) gets the Greeting CRD with v1 (storage) and v1alpha1
(deprecated, converted by the webhook), N Greetings created in v1, and the webhook running in this process (as in
the operator: ``ConversionWebhook`` on a TLS port, certificate and caBundle managed by it). Measured:

- LIST in v1 (no conversion) and LIST in v1alpha1, ``--repeat`` times each, interleaved, one page each: the
  consistent LIST ``kubectl get`` makes; and one LIST at an exact revision.
- how many reviews the webhook answered while the objects were created and during the LISTs: the API server keeps a
  watch cache per served version and converts each object into it when it is written (one review per write), so
  LISTs served from that cache call the webhook little or not at all;
- one review holding all N objects, POSTed over TLS to the webhook: what a LIST read from etcd costs it;
- the webhook's own mean time per review (its ``kanri_conversion_webhook_duration_seconds``) and the pure
  conversion cost of N objects in-process (``review_response``, no HTTP, no TLS).

With ``--migrate`` it first measures a storage migration (``kanri.runtime.StorageMigration``): N Greetings
created while v1alpha1 is the storage version, the CRD switched to v1, every object rewritten at ``--migration-rate``
writes a second (each converted by the webhook on read), and ``status.storedVersions`` pruned to ``["v1"]``.

Prints a Markdown section for docs/benchmarks.md. Numbers only, never an assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import platform
import secrets
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from kanri.local import ControlPlane
from kanri.runtime import (
    Client,
    Conversions,
    ConversionWebhook,
    Kind,
    StorageMigration,
    Unlimited,
    WebhookOptions,
    install_crd,
)
from kanri.runtime._conversion_webhook import review_response
from kanri.runtime.kinds import CRD, NAMESPACE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.greeting.operator import GREETING, GREETINGS, greeting_crd
from kanri.local.ports import free_port

Obj = dict[str, Any]
GREETING_CRD = "greetings.example.kanri.dev"
OLD = Kind("example.kanri.dev/v1alpha1", "Greeting", "greetings")
NS = "bench"


async def _create(client: Client, count: int) -> None:
    semaphore = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        async with semaphore:
            body = {"metadata": {"name": f"g-{i:05d}", "namespace": NS},
                    "spec": {"message": f"hello {i}", "publish": {"key": "hello"}, "language": "ja"}}  # fmt: skip
            await client.create(GREETING, body)

    await asyncio.gather(*(one(i) for i in range(count)))


async def _timed_list(client: Client, kind: Kind, expect: int) -> float:
    started = time.perf_counter()
    items, _ = await client.list(kind, NS, page_size=expect + 1)  # one page: one review for the whole list
    elapsed = time.perf_counter() - started
    if len(items) != expect:
        raise RuntimeError(f"listed {len(items)} {kind.api_version} objects, expected {expect}")
    return elapsed


async def bench(kubeconfig: str, objects: int, repeat: int) -> dict[str, float]:
    registry = CollectorRegistry()
    async with await Client.from_kubeconfig(kubeconfig, rate_limiter=Unlimited()) as client:
        port = free_port()
        options = WebhookOptions(namespace="default", secret=f"bench-{secrets.token_hex(3)}",
                                 url=f"https://127.0.0.1:{port}/convert", host="127.0.0.1", port=port)  # fmt: skip
        await install_crd(client, greeting_crd(options), field_manager="bench")
        await client.create(NAMESPACE, {"metadata": {"name": NS}})
        webhook = ConversionWebhook(client, Conversions(GREETINGS), options, registry=registry)
        serving = asyncio.create_task(webhook.run())
        try:
            while not webhook.ready():
                if serving.done():
                    serving.result()
                await asyncio.sleep(0.2)
            started = time.perf_counter()
            await _create(client, objects)
            create_seconds = time.perf_counter() - started
            reviews_after_create = _reviews(registry)
            v1, v1alpha1 = [], []
            for _ in range(repeat):
                v1.append(await _timed_list(client, GREETING, objects))
                v1alpha1.append(await _timed_list(client, OLD, objects))
            reviews_during_lists = _reviews(registry) - reviews_after_create
            stored, revision = await client.list(GREETING, NS, page_size=objects + 1)
            # An exact-revision LIST: the API server may read etcd for it, and then converts every object at once.
            started = time.perf_counter()
            exact = await client.get_path(OLD.path(NS) + f"?resourceVersionMatch=Exact&resourceVersion={revision}")
            exact_seconds = time.perf_counter() - started
            reviews_exact = _reviews(registry) - reviews_after_create - reviews_during_lists
            if len(exact["items"]) != objects:
                raise RuntimeError(f"exact LIST gave {len(exact['items'])} objects")
            # What the API server sends when it reads a LIST from etcd: one review holding every object.
            whole = await _post_review(webhook, options, stored)
        finally:
            serving.cancel()
    started = time.perf_counter()
    review = {"request": {"uid": "b", "desiredAPIVersion": OLD.api_version, "objects": stored}}
    answer = review_response(Conversions(GREETINGS), review)
    pure = time.perf_counter() - started
    assert answer["response"]["result"]["status"] == "Success"
    total = registry.get_sample_value("kanri_conversion_webhook_duration_seconds_sum", {"result": "success"}) or 0.0
    count = _reviews(registry) or 1.0
    return {
        "whole_list_review_ms": whole * 1000,
        "reviews_after_create": reviews_after_create,
        "reviews_during_lists": reviews_during_lists,
        "list_exact_ms": exact_seconds * 1000,
        "reviews_exact": reviews_exact,
        "create_seconds": create_seconds,
        "list_v1_ms": statistics.median(v1) * 1000,
        "list_v1alpha1_ms": statistics.median(v1alpha1) * 1000,
        "list_v1alpha1_max_ms": max(v1alpha1) * 1000,
        "webhook_review_mean_ms": total / count * 1000,
        "webhook_reviews": count,
        "pure_conversion_ms": pure * 1000,
    }


async def _post_review(webhook: ConversionWebhook, options: WebhookOptions, objects: list[Obj]) -> float:
    """Seconds for one ConversionReview of ``objects`` to v1alpha1, over TLS, as the API server would send it."""
    crd = await webhook.client.get(CRD, GREETING_CRD)
    bundle = base64.b64decode(crd["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"]).decode()
    review = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
              "request": {"uid": "bench", "desiredAPIVersion": OLD.api_version, "objects": objects}}  # fmt: skip
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        async with session.post(str(options.url), json=review, ssl=ssl.create_default_context(cadata=bundle)) as sent:
            answer = await sent.json()
        elapsed = time.perf_counter() - started
    if len(answer["response"]["convertedObjects"]) != len(objects):
        raise RuntimeError(f"the webhook answered {answer['response']['result']}")
    return elapsed


async def bench_migration(kubeconfig: str, objects: int, rate: float) -> dict[str, float]:
    """Seconds to migrate ``objects`` Greetings stored in v1alpha1 to v1 storage; the webhook's reviews meanwhile."""
    registry, namespace = CollectorRegistry(), "bench-migration"
    async with await Client.from_kubeconfig(kubeconfig, rate_limiter=Unlimited()) as client:
        port = free_port()
        options = WebhookOptions(namespace="default", secret=f"bench-{secrets.token_hex(3)}",
                                 url=f"https://127.0.0.1:{port}/convert", host="127.0.0.1", port=port)  # fmt: skip
        crd: Obj = greeting_crd(options)
        for version in crd["spec"]["versions"]:  # the old operator's CRD: v1alpha1 is the storage version
            version["storage"] = version["name"] == "v1alpha1"
        await install_crd(client, crd, field_manager="bench")
        await client.create(NAMESPACE, {"metadata": {"name": namespace}})
        webhook = ConversionWebhook(client, Conversions(GREETINGS), options, registry=registry)
        serving = asyncio.create_task(webhook.run())
        try:
            while not webhook.ready():
                if serving.done():
                    serving.result()
                await asyncio.sleep(0.2)
            semaphore = asyncio.Semaphore(32)

            async def one(i: int) -> None:
                async with semaphore:
                    body = {"metadata": {"name": f"m-{i:05d}", "namespace": namespace}, "spec": {"text": f"hi {i}"}}
                    await client.create(OLD, body)

            await asyncio.gather(*(one(i) for i in range(objects)))
            current = await client.get(CRD, GREETING_CRD)
            for version in current["spec"]["versions"]:
                version["storage"] = version["name"] == "v1"
            await client.replace(CRD, current)  # the upgrade: v1 becomes the storage version
            await asyncio.sleep(
                2
            )  # let the API server swap the kind's storage (a request meeting the old one gets 503)
            before = _reviews(registry)
            started = time.perf_counter()
            result = await StorageMigration(client, GREETING_CRD, registry=registry, rate=rate).migrate()
            seconds = time.perf_counter() - started
            stored = (await client.get(CRD, GREETING_CRD))["status"]["storedVersions"]
            if stored != ["v1"] or result.migrated != objects:
                raise RuntimeError(f"migrated {result.migrated} of {objects}; storedVersions {stored}")
            reviews = _reviews(registry) - before
            await client.delete(NAMESPACE, namespace)
        finally:
            serving.cancel()
    return {"migration_seconds": seconds, "migration_reviews": reviews, "migration_rate": rate}


def _reviews(registry: CollectorRegistry) -> float:
    labels = {"result": "success"}
    return registry.get_sample_value("kanri_conversion_webhook_duration_seconds_count", labels) or 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--migrate", action="store_true", help="measure a storage migration of --objects first")
    parser.add_argument("--migration-rate", type=float, default=20.0, help="writes per second (default 20)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kanri-bench-conversion-") as scratch:
        cp = ControlPlane(Path(scratch) / "controlplane")
        endpoint = cp.start(exit_with_parent=True)
        try:
            migration = {}
            if args.migrate:
                migration = asyncio.run(bench_migration(str(endpoint.kubeconfig), args.objects, args.migration_rate))
            result = asyncio.run(bench(str(endpoint.kubeconfig), args.objects, args.repeat))
        finally:
            cp.stop()
    n = args.objects
    print(f"## Conversion webhook: LIST of {n} Greetings ({platform.machine()}, {os.cpu_count()} cores)\n")
    print(
        f"Median of {args.repeat} LISTs each, one page; Greetings created in v1 in {result['create_seconds']:.1f} s.\n"
    )
    print(f"Reviews the webhook answered: {result['reviews_after_create']:.0f} while the objects were created (and")
    print(f"the self-test), {result['reviews_during_lists']:.0f} during the {2 * args.repeat} plain LISTs.\n")
    rows = [
        ("LIST in v1 (storage version, no conversion)", result["list_v1_ms"]),
        ("LIST in v1alpha1", result["list_v1alpha1_ms"]),
        (f"one review of all {n} objects, over TLS (an etcd-served LIST)", result["whole_list_review_ms"]),
        ("slowest LIST in v1alpha1", result["list_v1alpha1_max_ms"]),
        (f"LIST in v1alpha1 at an exact revision ({result['reviews_exact']:.0f} reviews)", result["list_exact_ms"]),
        (f"webhook time per review, mean of {result['webhook_reviews']:.0f}", result["webhook_review_mean_ms"]),
        (f"conversion of {n} objects in-process (no HTTP/TLS)", result["pure_conversion_ms"]),
    ]
    print("| measure | ms |\n|---|---|")
    for label, value in rows:
        print(f"| {label} | {value:.1f} |")
    if migration:
        rate = migration["migration_rate"]
        print(f"\nStorage migration of {n} Greetings from v1alpha1 to v1 at {rate:.0f} writes/s: "
              f"{migration['migration_seconds']:.1f} s ({n / migration['migration_seconds']:.1f} objects/s), "
              f"{migration['migration_reviews']:.0f} webhook reviews; storedVersions pruned to [v1].")  # fmt: skip


if __name__ == "__main__":
    main()
