"""A small stateful operator assembled from kanri.kit pieces: each KeyValueStore publishes its data in a ConfigMap
and gets a generated key Secret that its deletionPolicy keeps or deletes.

python -m examples.stateful.operator --kubeconfig PATH --install-crd
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Gauge

from kanri import kit
from kanri import runtime as kr
from kanri.runtime.kinds import CONFIG_MAP, SECRET

from .api import FIELD_MANAGER, FINALIZER, KIND, LABELS, KeyValueStore
from .steps import STEPS, spec_of


class KeyValueStoreReconciler:
    """Loads the store, handles deletion (finalize), and runs the steps in one pass (kanri.kit.ObjectPass)."""

    def __init__(self, manager: kr.Manager, *, registry: CollectorRegistry = REGISTRY) -> None:
        self.cache, self.client = manager.cache, manager.client
        self.events = kr.EventRecorder(self.client, component=FIELD_MANAGER)
        self.keys = Gauge(kit.metric_name("example", "store", "keys"), "Keys a KeyValueStore publishes.",
                          ["namespace", "store"], registry=registry)  # fmt: skip

    async def reconcile(self, request: kr.Request) -> kr.Result | None:
        store = self.cache.get(KIND, request.name, request.namespace)
        if store is None:  # gone: owned children follow through garbage collection; the Secret stayed or went
            with contextlib.suppress(KeyError):
                self.keys.remove(request.namespace, request.name)
            return None
        return await kit.finalize(self.client, KIND, store, FINALIZER, apply=self.apply, cleanup=self.cleanup)

    async def apply(self, store: dict[str, Any]) -> kr.Result | None:
        ctx = kit.ObjectPass(client=self.client, cache=self.cache, events=self.events, kind=KIND, obj=store,
                             labels=LABELS, field_manager=FIELD_MANAGER)  # fmt: skip
        self.keys.labels(ctx.namespace, ctx.name).set(len(spec_of(ctx).data))
        return await ctx.run(STEPS)

    async def cleanup(self, store: dict[str, Any]) -> kr.Result | None:
        data = kit.data_of(self.cache, [SECRET], LABELS, store)
        await kit.carry_out(kit.deletion_policy(store), self.client, self.events, store, data)
        return None


def controller(manager: kr.Manager, *, registry: CollectorRegistry = REGISTRY) -> kr.Controller:
    """The store's controller: its ConfigMaps are owned; its key Secrets (not owned) are mapped back by label."""

    reconciler = KeyValueStoreReconciler(manager, registry=registry)
    built = kr.Controller("keyvaluestore", reconciler, for_kind=KIND).owns(CONFIG_MAP)
    return built.watches(SECRET, LABELS.owner_requests)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig")
    parser.add_argument("--install-crd", action="store_true")
    parser.add_argument("--health-port", type=int, default=8081)
    args = parser.parse_args()
    kr.configure_logging()
    async with await kr.Client.auto(args.kubeconfig) as client:
        if args.install_crd:
            await kr.install_crd(client, KeyValueStore, field_manager=FIELD_MANAGER)
        manager = kr.Manager(client, kr.ManagerOptions(name=FIELD_MANAGER, health_port=args.health_port))
        manager.add(controller(manager))
        await manager.run()


if __name__ == "__main__":
    asyncio.run(main())
