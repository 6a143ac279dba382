"""A complete operator on kanri.runtime: each Greeting gets a ConfigMap holding its message.

python examples/greeting/operator.py --kubeconfig PATH --install-crd
"""

from __future__ import annotations

import argparse
import asyncio

from pydantic import Field

from examples.greeting.views import GreetingView
from kanri import runtime as kr
from kanri.runtime.kinds import CONFIG_MAP


class GreetingSpec(kr.KubeModel):
    message: str
    """The text to put in the ConfigMap."""


class GreetingStatus(kr.KubeModel):
    observed_generation: int | None = None
    conditions: kr.Conditions = Field(default_factory=list)


class Greeting(kr.CustomResource, group="example.kanri.dev", version="v1", kind="Greeting", plural="greetings",
               short_names=("gr",), printer_columns=(kr.PrinterColumn("Message", ".spec.message"),)):  # fmt: skip
    """A message the operator publishes as a ConfigMap."""

    spec: GreetingSpec
    status: GreetingStatus | None = None


GREETING = Greeting.resource.api_kind


class GreetingReconciler:
    def __init__(self, manager: kr.Manager) -> None:
        self.cache, self.client = manager.cache, manager.client

    async def reconcile(self, request: kr.Request) -> kr.Result | None:
        # The cached dict, typed by the view generated from the model (views.py): a key typo is a mypy error.
        greeting = kr.as_view(self.cache.get(GREETING, request.name, request.namespace), GreetingView)
        if greeting is None or "deletionTimestamp" in greeting["metadata"]:
            return None  # the garbage collector removes the ConfigMap through its ownerReference
        name = kr.child_name(request.name, "greeting")
        data = {"message": greeting["spec"]["message"]}
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
    args = parser.parse_args()
    kr.configure_logging()
    async with await kr.Client.auto(args.kubeconfig) as client:
        if args.install_crd:
            await kr.install_crd(client, Greeting, field_manager="greeting-operator")  # returns once it is served
        options = kr.ManagerOptions(
            name="greeting-operator", health_host=args.health_host, health_port=args.health_port
        )
        manager = kr.Manager(client, options)
        manager.add(kr.Controller("greeting", GreetingReconciler(manager), for_kind=GREETING).owns(CONFIG_MAP))
        await manager.run()


if __name__ == "__main__":
    asyncio.run(main())
