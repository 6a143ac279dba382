"""A complete operator on kanri.runtime: each Greeting gets a ConfigMap holding its message.

python examples/greeting/operator.py --kubeconfig PATH --install-crd

Greeting is served in two versions: ``v1`` (api.py; the hub and the storage version) and the deprecated
``v1alpha1`` (versions.py). With ``--webhook-url`` or ``--webhook-service`` the operator serves the conversion
webhook between them in every replica (see docs/runtime-versions.md).
"""

from __future__ import annotations

import argparse
import asyncio

from examples.greeting.api import GREETING, Greeting, GreetingPublish, GreetingSpec, GreetingStatus
from examples.greeting.versions import GREETINGS, GreetingV1Alpha1
from examples.greeting.views import GreetingView
from kanri import runtime as kr
from kanri.runtime.kinds import CONFIG_MAP

__all__ = [
    "GREETING",
    "GREETINGS",
    "Greeting",
    "GreetingPublish",
    "GreetingReconciler",
    "GreetingSpec",
    "GreetingStatus",
    "GreetingV1Alpha1",
    "greeting_crd",
]


class GreetingReconciler:
    def __init__(self, manager: kr.Manager) -> None:
        self.cache, self.client = manager.cache, manager.client

    async def reconcile(self, request: kr.Request) -> kr.Result | None:
        # The cached dict, typed by the view generated from the model (views.py): a key typo is a mypy error.
        greeting = kr.as_view(self.cache.get(GREETING, request.name, request.namespace), GreetingView)
        if greeting is None or "deletionTimestamp" in greeting["metadata"]:
            return None  # the garbage collector removes the ConfigMap through its ownerReference
        name = kr.child_name(request.name, "greeting")
        spec = greeting["spec"]
        publish = spec.get("publish")
        data = {publish["key"] if publish is not None else "message": spec["message"]}
        if "language" in spec:
            data["language"] = spec["language"]
        current = self.cache.get(CONFIG_MAP, name, request.namespace)
        if current is None or current.get("data") != data:  # write only what differs
            owner = [kr.owner_reference(greeting)]
            desired = {
                "metadata": {"name": name, "namespace": request.namespace, "ownerReferences": owner},
                "data": data,
            }
            await self.client.apply(CONFIG_MAP, desired, field_manager="greeting-operator")
        # One merge patch of what differs, none when the status already says this (a converged object: no write).
        await kr.update_status(
            self.client, GREETING, greeting,
            fields={"observedGeneration": greeting["metadata"]["generation"]},
            conditions=[{"type": "Ready", "status": True, "reason": "Published", "message": "ConfigMap is up to date"}],
        )  # fmt: skip
        return None


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig")
    parser.add_argument("--install-crd", action="store_true")
    parser.add_argument("--health-port", type=int, default=8081)
    parser.add_argument("--health-host", default="127.0.0.1", help="0.0.0.0 in a pod, for the kubelet's probes")
    parser.add_argument("--namespace", default="default", help="where the webhook's certificate Secret lives")
    webhook = parser.add_mutually_exclusive_group()
    webhook.add_argument("--webhook-url", help="serve conversion; the API server calls this URL (outside a cluster)")
    webhook.add_argument("--webhook-service", help="serve conversion behind this Service (in a cluster)")
    parser.add_argument("--webhook-port", type=int, default=9443)
    args = parser.parse_args()
    kr.configure_logging()
    async with await kr.Client.auto(args.kubeconfig) as client:
        options = kr.ManagerOptions(
            name="greeting-operator", health_host=args.health_host, health_port=args.health_port
        )
        manager = kr.Manager(client, options)
        conversion: kr.WebhookOptions | None = None
        if args.webhook_url or args.webhook_service:
            conversion = kr.WebhookOptions(
                namespace=args.namespace, secret="greeting-operator-webhook", url=args.webhook_url,
                service=args.webhook_service, port=args.webhook_port,
            )  # fmt: skip
            server = kr.ConversionWebhook(client, kr.Conversions(GREETINGS), conversion, registry=manager.registry)
            manager.add_server("conversion", server.run, ready=server.ready)
        if args.install_crd:
            crd = greeting_crd(conversion)
            await kr.install_crd(client, crd, field_manager="greeting-operator")  # returns once it is served
        manager.add(kr.Controller("greeting", GreetingReconciler(manager), for_kind=GREETING).owns(CONFIG_MAP))
        await manager.run()


def greeting_crd(webhook: kr.WebhookOptions | None) -> dict[str, object]:
    """Both versions, converted by the webhook when there is one (without: v1 only, no conversion needed)."""
    if webhook is None:
        return kr.crd_for(Greeting)
    return kr.crd_for(*GREETINGS.resources, webhook=webhook.client_config())


if __name__ == "__main__":
    asyncio.run(main())
